"""Which load levels of a profile sweep a replica held, and the request rate it holds up to.

Pure: sweep summaries (``harness.sweep``'s, one list per replica) in, rates out.  ``moeslo
profile`` writes the held rate into the profile as ``max_request_rate_rps`` (the capacity
model never sizes a replica for more) when a heavier level failed (a sweep whose every level held found no
limit), and ``moeslo up`` sizes its load from it.  A level holds
when 99 % of its requests were within both objectives (misses judged against chance: a level of a
few seconds holds tens of requests) and 99.5 % of its token gaps within the ITL objective (half
the ITL SLI's budget, taken as measured over its hundreds of gaps).  A level that missed while a
heavier one held counts as held: more load cannot make a replica faster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from controller.slo import misses_beyond_chance

if TYPE_CHECKING:
    from controller.replica_profile import CeilingConditions, ReplicaProfile

__all__ = ["GAP_SHARE", "HELD_SHARE", "MIN_HELD_REQUESTS", "held_rate_rps", "lightest_failed_rps", "with_held_ceiling"]

HELD_SHARE = 0.99
"""A level held when this share of its requests was within both objectives (the demo's own score) and
:data:`GAP_SHARE` of its token gaps within the ITL objective."""
GAP_SHARE = 0.995
"""Token gaps a level must keep within the ITL objective: half the controller's SLI budget (99 %).  The
SLI is judged over short windows, which swing around a level's mean, and in service the replica shares
its machine with more than the sweep did: in ``moeslo up`` runs, replicas profiled at 99.0-99.5 % read
96.6-97.8 % in the run's first 30 s windows (loads sized from 5.90 and 6.06 requests/s), where one
sized from 2.01 read 99.2-100 % (docs/benchmarks.md, sixth stop)."""
MIN_HELD_REQUESTS = 10
"""Pooled requests a level needs to count towards the held rate."""


@dataclass(frozen=True, slots=True)
class _Level:
    """One load level, the replicas pooled: its rate, and the larger share of its two error budgets
    (requests, gaps) its misses used."""

    rate_rps: float
    budget_used: float
    held: bool


def _pooled_levels(by_replica: list[list[dict[str, Any]]], share: float, gap_share: float) -> list[_Level]:
    """The levels that count (at least :data:`MIN_HELD_REQUESTS` pooled requests), lightest first; a level
    that missed while a heavier one held is taken as held (see :func:`_past_noise`)."""
    return _past_noise(_counted_levels(by_replica, share, gap_share))


def _past_noise(levels: list[_Level]) -> list[_Level]:
    """Levels with every miss lighter than the heaviest held level passed over.

    More load cannot make a replica faster: a level that missed while a heavier one held missed from the
    machine (a stalled CPU, the other replica starting), not from its load, and sizing from it would run
    the demo at a fifth of what the replica holds (a sweep of the eighth stop: 1.61 requests/s, against
    8.5 in four runs beside it, and no page in the injected fault at that load).
    """
    last_held = max((i for i, level in enumerate(levels) if level.held), default=-1)
    return [replace(level, held=True) if i < last_held else level for i, level in enumerate(levels)]


def _same_levels(by_replica: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The replicas' summaries of each level, lightest first: by the rate the sweep asked for (``rate_rps``), as a
    replica skips a level that drew no arrival; by position in summaries that do not carry it."""
    if all("rate_rps" in summary for levels in by_replica for summary in levels):
        rates = sorted({float(summary["rate_rps"]) for levels in by_replica for summary in levels})
        return [[s for levels in by_replica for s in levels if float(s["rate_rps"]) == rate] for rate in rates]
    return [[levels[i] for levels in by_replica if len(levels) > i] for i in range(max(map(len, by_replica)))]


def _counted_levels(by_replica: list[list[dict[str, Any]]], share: float, gap_share: float) -> list[_Level]:
    """The levels that count, as measured."""
    out = []
    for present in _same_levels(by_replica):
        requests = sum(summary["requests"] for summary in present)
        if requests < MIN_HELD_REQUESTS or any(summary.get("within_objectives") is None for summary in present):
            continue
        within_requests = sum(summary["within_objectives"] * summary["requests"] for summary in present) / requests
        within_gaps = _gaps_within(present)
        # Requests are few a level (one miss in 40, 97.5 %, says nothing), gaps are hundreds: a gap share is taken
        # as measured, since in service a replica shares its machine with more than the sweep did.
        held = not misses_beyond_chance(within_requests, requests, share) and within_gaps >= gap_share
        rate = float(np.mean([summary["requests_per_s"] or 0.0 for summary in present]))
        used = max((1.0 - within_requests) / (1.0 - share), (1.0 - within_gaps) / (1.0 - gap_share))
        out.append(_Level(rate, used, held))
    return out


def held_rate_rps(
    by_replica: list[list[dict[str, Any]]], share: float = HELD_SHARE, gap_share: float = GAP_SHARE
) -> float | None:
    """The request rate per replica up to which the levels kept ``share`` of their requests within
    both objectives *and* ``gap_share`` of their token gaps within the ITL objective (the controller's
    ITL SLI: a load the requests hold on average but whose gaps burn the error budget would have the
    controller scale up at the start), the replicas' levels pooled, and a level's request misses
    judged against the chance of that many at ``share`` (:func:`controller.slo.misses_beyond_chance`):
    the last held level's rate, carried towards the first level that did not hold, to where the larger share of an error
    budget used (linear between the two levels' own) reaches the whole budget.  Levels with fewer than
    :data:`MIN_HELD_REQUESTS` pooled requests are passed over (one request decides nothing), and so is a
    miss that a heavier level's hold undoes (:func:`_past_noise`); None when no level counts or the first
    that counts did not hold and nothing heavier did."""
    held: _Level | None = None
    for level in _pooled_levels(by_replica, share, gap_share):
        if level.held:
            held = level
            continue
        if held is None or level.rate_rps <= held.rate_rps:
            break
        # Where the budget used, linear between the two levels' own, reaches the whole budget.
        towards = (1.0 - held.budget_used) / max(level.budget_used - held.budget_used, 1e-9)
        return held.rate_rps + (level.rate_rps - held.rate_rps) * min(max(towards, 0.0), 1.0)
    return None if held is None else held.rate_rps


def lightest_failed_rps(
    by_replica: list[list[dict[str, Any]]], share: float = HELD_SHARE, gap_share: float = GAP_SHARE
) -> float | None:
    """The rate of the lightest level that counted and did not hold, a miss a heavier level undid passed
    over (None: every counted level held)."""
    return next((lv.rate_rps for lv in _pooled_levels(by_replica, share, gap_share) if not lv.held), None)


def _gaps_within(levels: list[dict[str, Any]]) -> float:
    """The pooled share of token gaps within the ITL objective (1.0 when no level counted its gaps)."""
    counted = [s for s in levels if s.get("gaps_within_objective") is not None and s.get("token_gaps")]
    gaps = sum(s["token_gaps"] for s in counted)
    return sum(s["gaps_within_objective"] * s["token_gaps"] for s in counted) / gaps if gaps else 1.0


def with_held_ceiling(
    profile: ReplicaProfile, summaries: list[dict[str, Any]], measured_at: CeilingConditions | None = None
) -> ReplicaProfile:
    """``profile`` with the rate one replica's sweep held (:func:`held_rate_rps`) as its ceiling
    (``max_request_rate_rps``: the capacity model never sizes a replica for more) and what it was measured
    under (``measured_at``: the capacity model caps only policies with objectives as strict or stricter and
    lengths not much shorter); unchanged when the first level that counted missed the objectives, and when every
    level held: the top swept rate is then only a lower bound (the sweep never found the limit), and as a ceiling it
    capped a replica the model says holds 20 requests/s at the 4 it was swept to."""
    held = held_rate_rps([summaries])
    if held is None or lightest_failed_rps([summaries]) is None:
        return profile
    return profile.model_copy(update={"max_request_rate_rps": held, "ceiling_measured_at": measured_at})
