"""The stack's first measurement: a short profile of its replicas, as ``moeslo profile`` takes one.

Every replica the run may have (as many as the CPUs hold, each pinned as the local actuator
pins it) is swept at once, with Poisson load at rising rates with the run's own prompt and
output lengths (after a warm-up of a few unmeasured requests), until p99 TTFT passes the
objective: in the run, the replicas share the machine with each other and with the load
generator, and one replica measured alone on an idle machine sustained about twice what it
does there.  Then the prefix probe on one replica (ten cold and ten cached-prefix prompts,
one at a time, each stopping at its first token: 0.7-1.3 s at the demo's lengths).  The
fitted :class:`ReplicaProfile` goes into the policy (the controller's capacity model sizes
this machine's replicas from it).  The load is sized from the rate the replicas held within
both objectives, per request (misses judged against chance) and per token gap (half the ITL SLI's
budget: :func:`held_rate_rps`),
and from the capacity model only when no level says, capped by the lightest level that missed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binom

from contracts.slo_defaults import TTFT_THRESHOLD_S
from controller.capacity import ReplicaProfile
from controller.profiling import fit_profile, prefix_probe_record, profile_point
from harness.prefix_probe import prefix_probe
from harness.sweep import sweep_rates
from stack.load import demo_length_pairs, demo_lengths, sustainable_rate_rps
from stack.state import StackState

__all__ = ["GAP_SHARE", "HELD_SHARE", "PROFILE_RATES_RPS", "held_rate_rps", "lightest_failed_rps", "profile_replicas"]

HELD_SHARE = 0.99
"""A level held when this share of its requests was within both objectives (the demo's own score) and
:data:`GAP_SHARE` of its token gaps within the ITL objective."""
GAP_SHARE = 0.995
"""Token gaps a level must keep within the ITL objective: half the controller's SLI budget (99 %).  The
SLI is judged over 30 s windows, which swing around a level's mean, and the run adds the rest of the
stack to the replicas' CPUs at times; a replica profiled at 99.0-99.5 % read 96.6-97.8 % in the run's
first windows (runs P-2 and P-3, sized from 5.90 and 6.06 requests/s), where one profiled at 2.01 read
99.2-99.6 % (P-1)."""
MIN_HELD_REQUESTS = 10
"""Pooled requests a level needs to count towards the held rate."""
MISS_SIGNIFICANCE = 0.05
"""A level did not hold when that many misses (or more) had less than this chance at the held share."""
PROFILE_RATES_RPS = (0.3, 1.0, 2.0, 3.0, 5.0, 8.0)
"""Load levels, lightest first; the sweep stops at the first past twice the TTFT objective (two at least)."""


def _sweep_all(state: StackState, urls: list[str], prompt: float, output: float, vocab_size: int,
               progress: Callable[[str], None]) -> list[list[dict[str, Any]]]:  # fmt: skip
    """The same sweep against every replica at once (a thread each): each replica's level summaries."""
    options = state.options
    pairs = demo_length_pairs(options)  # the run's own lengths: long prompts' prefill chunks stretch decodes

    def sweep(index: int) -> list[dict[str, Any]]:
        say = progress if len(urls) == 1 else (lambda line: progress(f"replica {index + 1}: {line}"))
        return sweep_rates(
            urls[index], PROFILE_RATES_RPS, duration_s=options.profile_s, prompt_tokens=round(prompt),
            output_tokens=max(2, round(output)), vocab_size=vocab_size, model=None,
            seed=options.seed + 1000 * index, ttft_limit_s=2 * TTFT_THRESHOLD_S, progress=say, min_levels=2,
            lengths=pairs,
        )

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return list(pool.map(sweep, range(len(urls))))


@dataclass(frozen=True, slots=True)
class _Level:
    """One load level, the replicas pooled: its rate, and the larger share of its two error budgets
    (requests, gaps) its misses used."""

    rate_rps: float
    budget_used: float
    held: bool


def _pooled_levels(by_replica: list[list[dict[str, Any]]], share: float, gap_share: float) -> list[_Level]:
    """The levels that count (at least :data:`MIN_HELD_REQUESTS` pooled requests), lightest first."""
    out = []
    for level in range(max(len(levels) for levels in by_replica)):
        present = [levels[level] for levels in by_replica if len(levels) > level]
        requests = sum(summary["requests"] for summary in present)
        if requests < MIN_HELD_REQUESTS or any(summary.get("within_objectives") is None for summary in present):
            continue
        within_requests = sum(summary["within_objectives"] * summary["requests"] for summary in present) / requests
        within_gaps = _gaps_within(present)
        # Requests are few a level (one miss in 40 says nothing), gaps are hundreds: a gap share is taken
        # as measured, since the run adds the rest of the stack to the CPUs the profile had to itself.
        held = _not_worse(within_requests, requests, share) and within_gaps >= gap_share
        rate = float(np.mean([summary["requests_per_s"] or 0.0 for summary in present]))
        used = max((1.0 - within_requests) / (1.0 - share), (1.0 - within_gaps) / (1.0 - gap_share))
        out.append(_Level(rate, used, held))
    return out


def _not_worse(within: float, count: int, share: float) -> bool:
    """Whether ``within`` of ``count`` is consistent with ``share`` (one-sided binomial test at
    :data:`MISS_SIGNIFICANCE`): at the profile's few seconds a level, one miss in 40 requests is 97.5 %
    and says nothing."""
    misses = round((1.0 - within) * count)
    return misses == 0 or float(binom.sf(misses - 1, count, 1.0 - share)) >= MISS_SIGNIFICANCE


def held_rate_rps(
    by_replica: list[list[dict[str, Any]]], share: float = HELD_SHARE, gap_share: float = GAP_SHARE
) -> float | None:
    """The request rate per replica up to which the levels kept ``share`` of their requests within
    both objectives *and* ``gap_share`` of their token gaps within the ITL objective (the controller's
    ITL SLI: a load the requests hold on average but whose gaps burn the error budget would have the
    controller scale up at the start), the replicas' levels pooled, and a level's request misses
    judged against the chance of that many at ``share`` (:func:`_not_worse`): the last held level's
    rate, carried towards the first level that did not hold, to where the larger share of an error
    budget used (linear between the two levels' own) reaches the whole budget.  Levels with fewer than
    :data:`MIN_HELD_REQUESTS` pooled requests are passed over (one request decides nothing); None
    when no level counts or the first that counts did not hold."""
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
    """The rate of the lightest level that counted and did not hold (None: every counted level held)."""
    return next((lv.rate_rps for lv in _pooled_levels(by_replica, share, gap_share) if not lv.held), None)


def _gaps_within(levels: list[dict[str, Any]]) -> float:
    """The pooled share of token gaps within the ITL objective (1.0 when no level counted its gaps)."""
    counted = [s for s in levels if s.get("gaps_within_objective") is not None and s.get("token_gaps")]
    gaps = sum(s["token_gaps"] for s in counted)
    return sum(s["gaps_within_objective"] * s["token_gaps"] for s in counted) / gaps if gaps else 1.0


def _load_capacity(state: StackState, by_replica: list[list[dict[str, Any]]], profile: ReplicaProfile, *,
                   prompt: float, output: float, lightest: float) -> float:  # fmt: skip
    """The rate per replica the load is sized from: what the replicas held when a level says so.

    The capacity model's ITL line comes from a few medians; near the objective it swung the load
    from 0.2 to 6.8 requests/s between runs.  Without a level that counts, the model decides.
    """
    modelled = sustainable_rate_rps(profile, prompt_tokens=prompt, output_tokens=output)
    held = held_rate_rps(by_replica)
    if held is not None:
        state.event(f"the replicas held {HELD_SHARE:.0%} of their requests within both objectives, and "
                    f"{GAP_SHARE:.1%} of their token gaps within the ITL objective, up to {held:.2f} requests/s "
                    f"each: the load is "
                    f"sized from that (the capacity model says {modelled:.2f})")
        return held
    if modelled < lightest:
        # The model says a replica holds the objectives only below the lightest rate measured (a slow or
        # busy machine): run at that rate rather than at next to nothing, and say what to expect.
        state.event(f"this machine's replica holds the objectives only below {lightest:.2f} requests/s "
                    f"(ITL {profile.itl_base_s * 1000:.1f} ms at light load): the load runs at that rate, "
                    f"and no fleet size here may hold them")
        return lightest
    failed = lightest_failed_rps(by_replica)
    if failed is not None and failed < modelled:
        # The capacity model's line is fitted through medians; a level measured past its misses says more.
        state.event(f"no profile level held {HELD_SHARE:.0%} of its requests and {GAP_SHARE:.1%} of its token gaps "
                    f"within the objectives, the lightest that counted ({failed:.2f} requests/s) missed them: "
                    f"the load is sized from that (the capacity model says {modelled:.2f})")
        return failed
    state.event(f"no profile level held {HELD_SHARE:.0%} of its requests and {GAP_SHARE:.1%} of its token gaps "
                f"within the objectives: the load is sized from the capacity model ({modelled:.2f} requests/s "
                f"a replica)")
    return modelled


def profile_replicas(state: StackState, urls: list[str], progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure the replicas at ``urls`` under load at once; returns the profile (JSON) and the load's base rate.

    Every replica's levels are points of one profile (the fit takes medians over its light levels),
    so the profile describes a replica while the others are as busy as it is, as in the run.
    """
    from engine.config import ModelConfig

    options = state.options
    checkpoint = options.checkpoint or options.out / "checkpoint"
    _, prompt, output = demo_lengths(options)
    vocab_size = ModelConfig.load(checkpoint).vocab_size
    by_replica = _sweep_all(state, urls, prompt, output, vocab_size, progress)
    summaries = [summary for levels in by_replica for summary in levels]
    probe = prefix_probe_record(prefix_probe(urls[0], prompt_tokens=round(prompt), vocab_size=vocab_size,
                                             model=None, seed=options.seed))  # fmt: skip
    points = [profile_point(stats) for stats in summaries]
    profile = fit_profile(
        points, prompt_tokens=round(prompt), kv_capacity_tokens=100_000, max_num_seqs=64,
        prefill_chunk_tokens=options.max_num_batched_tokens, name="moeslo-up-replica", prefix_probe=probe,
        source=f"moeslo up: {len(points)} load levels of {options.profile_s:g} s over {len(urls)} replica(s) "
               f"loaded at once (one pinned CPU each, {options.ep_label}), {round(prompt)}/{max(2, round(output))} "
               f"tokens",
    )
    capacity = _load_capacity(state, by_replica, profile, prompt=prompt, output=output,
                              lightest=min(p.request_rate_rps for p in points))
    # The controller sizes a replica for no more than the load is sized from: its latency lines come
    # from medians, and said 1.6-4.5x what the replicas held in six runs (docs/benchmarks.md).
    profile = profile.model_copy(update={"max_request_rate_rps": capacity})
    base = options.base_load * capacity
    state.profile = {"profile": profile.model_dump(mode="json"), "replica_rate_rps": capacity,
                     "base_rate_rps": base}
    state.event(f"profiled {len(urls)} replica(s) loaded at once: the load is sized from {capacity:.2f} requests/s "
                f"a replica (ITL {profile.itl_base_s * 1000:.1f} ms + {profile.itl_per_seq_s * 1000:.2f} ms per "
                f"sequence, "
                f"prefill {profile.prefill_tokens_per_s:.0f} tokens/s, a cached prompt token costing "
                f"{profile.cached_token_cost:.2f} of a computed one); the load starts at {base:.2f} requests/s")
    return {"profile": profile.model_dump(mode="json"), "base_rate_rps": base}
