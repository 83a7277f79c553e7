"""Scores of a replay over a time window: attainment, replica-hours, worst hour, violation minutes.

A fleet reports, per tick, the requests that *arrived* in it and how many of them
met each SLO (:class:`TickOutcomes`), and the runner adds the replicas billed
during each tick (billing starts at the scale-up order: a starting replica holds
its GPU) and whether the count changed at its end.  Any window of the run is then
a slice: the first 30 minutes are scored apart from the rest, and a week can be
scored on its first days (for tuning) and its last days (for reporting) from the
same runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contracts.slo_defaults import LATENCY_TARGET
from contracts.traces import FloatArray

__all__ = ["Score", "TickOutcomes", "score"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class TickOutcomes:
    """Per-tick arrays of one run (index k covers ``[k * tick_s, (k + 1) * tick_s)``)."""

    tick_s: float
    requests: FloatArray
    good_both: FloatArray
    good_ttft: FloatArray
    good_itl: FloatArray
    provisioned: IntArray
    """Replicas billed during the tick."""
    ready: IntArray
    """Replicas serving at the end of the tick."""
    scaled: npt.NDArray[np.bool_]
    """The replica count changed at the end of the tick."""
    infeasible: FloatArray | None = None
    """Requests no fleet could serve within the TTFT objective (None: not known, as in fluid mode)."""
    prompt_tokens: FloatArray | None = None
    cached_tokens: FloatArray | None = None
    """Prompt tokens found in a replica's prefix cache (None: the trace names no blocks)."""

    @property
    def ticks(self) -> int:
        return len(self.requests)


@dataclass(frozen=True, kw_only=True, slots=True)
class Score:
    start_s: float
    end_s: float
    requests: float
    attainment_both: float
    attainment_ttft: float
    attainment_itl: float
    replica_hours: float
    worst_hour_attainment: float
    """Lowest attainment (both SLOs) of the window's whole hours, counted from its start (NaN: none)."""
    violation_minutes: int
    """Minutes whose arrivals met both SLOs less often than the objective (99 %)."""
    scale_events_per_hour: float
    peak_replicas: int
    mean_replicas: float
    infeasible_share: float = float("nan")
    """Share of requests no fleet could serve within the TTFT objective (NaN: not known)."""
    attainment_feasible: float = float("nan")
    """Attainment (both SLOs) over the feasible requests only."""
    prefix_hit_rate: float = float("nan")
    """Share of prompt tokens found in a replica's prefix cache (NaN: the trace names no blocks)."""

    @property
    def violation_rate(self) -> float:
        return 1.0 - self.attainment_both

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "requests": round(self.requests),
            "attainment_both": _finite(self.attainment_both, 6),
            "attainment_ttft": _finite(self.attainment_ttft, 6),
            "attainment_itl": _finite(self.attainment_itl, 6),
            "replica_hours": round(self.replica_hours, 3),
            "worst_hour_attainment": round(self.worst_hour_attainment, 5)
            if math.isfinite(self.worst_hour_attainment)
            else None,
            "violation_minutes": self.violation_minutes,
            "scale_events_per_hour": round(self.scale_events_per_hour, 3),
            "peak_replicas": self.peak_replicas,
            "mean_replicas": round(self.mean_replicas, 3),
            "infeasible_share": _finite(self.infeasible_share, 6),
            "attainment_feasible": _finite(self.attainment_feasible, 6),
            "prefix_hit_rate": _finite(self.prefix_hit_rate, 6),
        }


def _finite(value: float, digits: int) -> float | None:
    """JSON has no NaN: a window without requests has no attainment."""
    return round(value, digits) if math.isfinite(value) else None


def _grouped(values: FloatArray, ticks_per_group: int) -> FloatArray:
    whole = len(values) // ticks_per_group * ticks_per_group
    return np.asarray(values[:whole].reshape(-1, ticks_per_group).sum(axis=1), dtype=np.float64)


def score(outcomes: TickOutcomes, start_s: float, end_s: float, *, objective: float = LATENCY_TARGET) -> Score:
    """Scores of the ticks that start in ``[start_s, end_s)``."""
    tick_s = outcomes.tick_s
    lo = max(math.ceil(start_s / tick_s - 1e-9), 0)
    hi = outcomes.ticks if math.isinf(end_s) else min(math.ceil(end_s / tick_s - 1e-9), outcomes.ticks)
    hi = max(hi, lo)
    requests = outcomes.requests[lo:hi]
    both = outcomes.good_both[lo:hi]
    total = float(requests.sum())

    def ratio(good: FloatArray) -> float:
        return float(good.sum()) / total if total > 0 else float("nan")

    minute = max(round(60.0 / tick_s), 1)
    per_minute = _grouped(requests, minute)
    good_minute = _grouped(both, minute)
    busy = per_minute > 0
    violation_minutes = int(np.count_nonzero(good_minute[busy] < objective * per_minute[busy] - 1e-9))
    hour = max(round(3600.0 / tick_s), 1)
    per_hour = _grouped(requests, hour)
    good_hour = _grouped(both, hour)
    hourly = good_hour[per_hour > 0] / per_hour[per_hour > 0]
    provisioned = outcomes.provisioned[lo:hi]
    hours = (hi - lo) * tick_s / 3600.0
    extra = _long_prompt_scores(outcomes, lo, hi, total, float(both.sum()))
    return Score(
        start_s=lo * tick_s,
        end_s=hi * tick_s,
        requests=total,
        attainment_both=ratio(both),
        attainment_ttft=ratio(outcomes.good_ttft[lo:hi]),
        attainment_itl=ratio(outcomes.good_itl[lo:hi]),
        replica_hours=float(provisioned.sum()) * tick_s / 3600.0,
        worst_hour_attainment=float(hourly.min()) if len(hourly) else float("nan"),
        violation_minutes=violation_minutes,
        scale_events_per_hour=float(np.count_nonzero(outcomes.scaled[lo:hi])) / hours if hours > 0 else 0.0,
        peak_replicas=int(provisioned.max()) if len(provisioned) else 0,
        mean_replicas=float(provisioned.mean()) if len(provisioned) else 0.0,
        **extra,
    )


def _long_prompt_scores(outcomes: TickOutcomes, lo: int, hi: int, total: float, good: float) -> dict[str, float]:
    """Infeasible share, attainment over the feasible requests, prefix-cache hit rate (NaN where unknown)."""
    out: dict[str, float] = {}
    if outcomes.infeasible is not None and total > 0:
        infeasible = float(outcomes.infeasible[lo:hi].sum())
        out["infeasible_share"] = infeasible / total
        # Infeasible requests are bad by definition (their idle TTFT already misses), so good ones are feasible.
        out["attainment_feasible"] = good / (total - infeasible) if total > infeasible else float("nan")
    if outcomes.prompt_tokens is not None and outcomes.cached_tokens is not None:
        prompt = float(outcomes.prompt_tokens[lo:hi].sum())
        if prompt > 0:
            out["prefix_hit_rate"] = float(outcomes.cached_tokens[lo:hi].sum()) / prompt
    return out
