"""Observation checks of the decision core: NaN, infinite, negative and out-of-range values are unknown.

Split from :mod:`controller.core` (which re-exports :func:`sanitize_observation`).
Pure functions, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from controller.types import PolicyObservation

__all__ = ["sanitize_observation"]

_OBSERVATION_FIELDS = (
    "queue_depth",
    "router_queued",
    "router_refused_rps",
    "running_requests",
    "request_rate_rps",
    "request_rate_peak_rps",
    "prompt_tokens_per_s",
    "output_tokens_per_s",
    "kv_cache_usage",
)
_SLI_FIELDS = ("requests_in_window", "ttft_good_ratio", "itl_good_ratio", "ttft_p99_s", "itl_p99_s")
_RATIO_FIELDS = frozenset({"kv_cache_usage", "ttft_good_ratio", "itl_good_ratio"})


def _invalid(name: str, value: float | None) -> bool:
    if value is None:
        return False
    if not math.isfinite(value) or value < 0:
        return True
    return name in _RATIO_FIELDS and value > _RATIO_MAX


_RATIO_MAX = 1.0 + 1e-9


def _plausible(obs: PolicyObservation) -> bool:
    """The common case, checked inline (every tick, every policy): all values finite and in range.

    NaN fails every comparison, so it falls through to the field-by-field pass.
    """
    inf = math.inf
    q, run, rate, pt, ot, kv = (
        obs.queue_depth,
        obs.running_requests,
        obs.request_rate_rps,
        obs.prompt_tokens_per_s,
        obs.output_tokens_per_s,
        obs.kv_cache_usage,
    )
    if not (
        (q is None or 0.0 <= q < inf)
        and (run is None or 0.0 <= run < inf)
        and (rate is None or 0.0 <= rate < inf)
        and (pt is None or 0.0 <= pt < inf)
        and (ot is None or 0.0 <= ot < inf)
        and (kv is None or 0.0 <= kv <= _RATIO_MAX)
        and (obs.router_queued is None or 0.0 <= obs.router_queued < inf)
        and (obs.router_refused_rps is None or 0.0 <= obs.router_refused_rps < inf)
        and (obs.request_rate_peak_rps is None or 0.0 <= obs.request_rate_peak_rps < inf)
        and (obs.current_replicas is None or obs.current_replicas >= 0)
        and (obs.ready_replicas is None or obs.ready_replicas >= 0)
        and (obs.replica_budget is None or obs.replica_budget >= 0)
    ):
        return False
    sli = obs.sli
    if sli is None:
        return True
    n, tg, ig, tp, ip = sli.requests_in_window, sli.ttft_good_ratio, sli.itl_good_ratio, sli.ttft_p99_s, sli.itl_p99_s
    return (
        -inf < sli.observed_at_s < inf
        and (n is None or 0.0 <= n < inf)
        and (tg is None or 0.0 <= tg <= _RATIO_MAX)
        and (ig is None or 0.0 <= ig <= _RATIO_MAX)
        and (tp is None or 0.0 <= tp < inf)
        and (ip is None or 0.0 <= ip < inf)
    )


def sanitize_observation(obs: PolicyObservation) -> tuple[PolicyObservation, tuple[str, ...]]:
    """Turn NaN, infinite, negative and out-of-range values into ``None`` (unknown).

    Prometheus answers 0/0 with NaN; a source that passes it on must not make the
    core scale on it.  Returns the observation (the same object when all is well)
    and the names of the fields that were dropped.
    """
    if _plausible(obs):
        return obs, ()
    invalid = [name for name in _OBSERVATION_FIELDS if _invalid(name, getattr(obs, name))]
    changes: dict[str, Any] = dict.fromkeys(invalid)
    for name in ("current_replicas", "ready_replicas", "replica_budget"):
        value = getattr(obs, name)
        if value is not None and value < 0:
            invalid.append(name)
            changes[name] = None
    sli = obs.sli
    if sli is not None:
        bad_sli = [name for name in _SLI_FIELDS if _invalid(name, getattr(sli, name))]
        if not math.isfinite(sli.observed_at_s):
            changes["sli"] = None
            invalid.append("sli.observed_at_s")
        elif bad_sli:
            dropped: dict[str, Any] = dict.fromkeys(bad_sli)
            changes["sli"] = replace(sli, **dropped)
            invalid.extend(f"sli.{name}" for name in bad_sli)
    if not changes:
        return obs, ()
    return replace(obs, **changes), tuple(invalid)
