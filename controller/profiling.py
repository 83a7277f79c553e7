"""Turn a load sweep against one engine replica into a :class:`ReplicaProfile`.

``moeslo profile`` sends Poisson load (:mod:`harness.sweep`) at increasing rates with fixed prompt and
output lengths and records, per rate, the achieved throughput and the p50/p99 of
TTFT and ITL (:class:`ProfilePoint`).  The profile's parameters are fitted from
those points with the capacity model's own equations:

- ``itl_base_s``: the median ITL at light load (a batch of about one);
- ``itl_per_seq_s``: the least-squares slope of median ITL against the running
  sequences, ``b = output tokens/s * ITL`` (Little's law), or, when steeper, the slope at
  which the model's p99 ITL meets the measured p99s (:func:`tail_slope`: the objective is
  on the tail, and on a small machine the tail rises with load much faster than the median);
- ``prefill_tokens_per_s``: prompt length over the median TTFT at light load, less
  one decode step (the first token comes after the prefill and one step).

"Light load" is pooled over levels rather than read off the lightest one, which at a
low rate may hold a single request.  A level is *light* when its running batch ``b`` is
at most :data:`LIGHT_RUNNING_SEQS` and it keeps the replica prefilling less than half the
time (``rate * (TTFT p50 - ITL p50) < 0.5``: then most requests find no prompt ahead of
them, so its median TTFT holds no queueing).  Light levels with fewer than
:data:`MIN_LEVEL_REQUESTS` requests are left out when another light level has that many;
when no level is light, the lightest one is used.  The base ITL and the light TTFT are
the medians of those levels' p50s, each level counting once (its p50 already pools its
requests; a level's hiccup, such as a busy machine for its whole duration, is not made
smaller by its request count), so with three light levels one noisy level moves neither.
(The sweep also warms the replica up first, so its first, cold request is not measured.)

``cached_token_cost`` comes from the sweep's prefix probe (:mod:`harness.prefix_probe`):
at the same prompt length, cold prompts against prompts whose share ``s`` was in the
prefix cache.  With both TTFTs less the same decode step, ``cached / cold = (1 - s) + s c``
(:func:`fit_cached_token_cost`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contracts.errors import ValidationError
from controller.capacity import CapacityModel, Load, PrefixProbe, ProfilePoint, ReplicaProfile, Targets

__all__ = [
    "LIGHT_RUNNING_SEQS",
    "MAX_PREFILL_BUSY",
    "MIN_LEVEL_REQUESTS",
    "MIN_TAIL_REQUESTS",
    "fit_cached_token_cost",
    "fit_profile",
    "light_levels",
    "prefix_probe_record",
    "profile_point",
    "tail_slope",
]

LIGHT_RUNNING_SEQS = 2.0
"""Levels whose running batch is at most this count as light load (beyond the lightest one)."""
MIN_LEVEL_REQUESTS = 5
"""Light levels with fewer requests are left out when another light level has this many."""
MAX_PREFILL_BUSY = 0.5
"""Light levels prefill less than this share of the time (most requests then wait for no other prompt)."""
MIN_TAIL_REQUESTS = 100
"""Levels with fewer requests do not fit the tail: their p99 is a request or two's worst moment (measured:
5 s levels of 15-43 requests put the demo's replicas anywhere from 0 to 3 requests/s)."""


def profile_point(stats: Mapping[str, Any]) -> ProfilePoint:
    """A :class:`ProfilePoint` from one rate's load summary (``ok``, ``wall_s``, tokens, latency percentiles)."""
    wall = stats["wall_s"]
    return ProfilePoint(
        request_rate_rps=stats["ok"] / wall,
        prompt_tokens_per_s=stats["prompt_tokens"] / wall,
        output_tokens_per_s=stats["output_tokens"] / wall,
        ttft_p99_s=stats["ttft_p99_s"] or 0.0,
        itl_p99_s=stats["itl_p99_s"] or 0.0,
        ttft_p50_s=stats["ttft_p50_s"],
        itl_p50_s=stats["itl_p50_s"],
        requests=stats["ok"],
    )


def prefix_probe_record(stats: Mapping[str, Any]) -> PrefixProbe | None:
    """A :class:`PrefixProbe` from :func:`harness.prefix_probe.prefix_probe`'s figures (None: a kind failed)."""
    cold, cached = stats["cold_ttft_p50_s"], stats["cached_ttft_p50_s"]
    if cold is None or cached is None:
        return None
    return PrefixProbe(cold_ttft_p50_s=cold, cached_ttft_p50_s=cached, cached_share=stats["cached_share"],
                       requests=min(len(stats["cold_ttft_s"]), len(stats["cached_ttft_s"])))


def running_seqs(point: ProfilePoint) -> float:
    """Sequences decoding at once at a level (Little's law: output tokens/s times ITL)."""
    return point.output_tokens_per_s * (point.itl_p50_s or 0.0)


def light_levels(usable: Sequence[ProfilePoint]) -> list[ProfilePoint]:
    """The levels that measure a light load (``usable`` sorted by rate; see the module docstring)."""
    light = [p for p in usable if running_seqs(p) <= LIGHT_RUNNING_SEQS and prefill_busy(p) < MAX_PREFILL_BUSY]
    light = light or list(usable[:1])
    enough = [p for p in light if p.requests >= MIN_LEVEL_REQUESTS]
    return enough or light


def prefill_busy(point: ProfilePoint) -> float:
    """Share of the time the replica prefilled at a level, were the median TTFT all prefill (an upper bound)."""
    return point.request_rate_rps * max((point.ttft_p50_s or 0.0) - (point.itl_p50_s or 0.0), 0.0)


def fit_cached_token_cost(cold_ttft_s: float, cached_ttft_s: float, *, cached_share: float, fixed_s: float) -> float:
    """A cached prompt token's prefill time relative to a computed one, in [0, 1] (0 when not measurable).

    ``cold_ttft_s`` and ``cached_ttft_s`` are TTFTs at the same prompt length on an idle replica,
    the second with ``cached_share`` of its prompt in the prefix cache; ``fixed_s`` is their common
    part that is no prefill (one decode step, as the prefill fit takes it).
    """
    cold = cold_ttft_s - fixed_s
    if cached_share <= 0 or cold <= 0:
        return 0.0
    ratio = max(cached_ttft_s - fixed_s, 0.0) / cold
    return min(max((ratio - (1.0 - cached_share)) / cached_share, 0.0), 1.0)


def tail_slope(points: Sequence[ProfilePoint], *, itl_base_s: float, prefill_tokens_per_s: float) -> float:
    """The per-sequence ITL slope at which the capacity model's p99 ITL meets the measured p99s (median over levels).

    The median line says little about the tail the objective is on: on a small machine a step
    now and then takes far longer than the median one (a prefill chunk beside the decodes,
    another process on the CPU), and the p99 ITL rises with load much faster than the median.
    Per level with at least :data:`MIN_TAIL_REQUESTS` requests, the slope that makes the model
    predict that level's measured p99 (bisection: the prediction grows with the slope), with
    the sweep's fixed prompt lengths; the median over levels, so one noisy level does not set it.
    """
    slopes = [
        _level_tail_slope(point, itl_base_s=itl_base_s, prefill_tokens_per_s=prefill_tokens_per_s)
        for point in points
        if point.requests >= MIN_TAIL_REQUESTS and point.itl_p99_s > 0 and point.request_rate_rps > 0
    ]
    return float(np.median(slopes)) if slopes else 0.0


def _level_tail_slope(point: ProfilePoint, *, itl_base_s: float, prefill_tokens_per_s: float) -> float:
    load = Load(request_rate_rps=point.request_rate_rps, prompt_tokens_per_s=point.prompt_tokens_per_s,
                output_tokens_per_s=point.output_tokens_per_s)  # fmt: skip

    def predicted(slope: float) -> float:
        profile = ReplicaProfile(prefill_tokens_per_s=prefill_tokens_per_s, itl_base_s=itl_base_s,
                                 itl_per_seq_s=slope, kv_capacity_tokens=1 << 30)  # fmt: skip
        return CapacityModel(profile, Targets(prompt_cv2=0.0)).predict(load, 1).itl_p99_s

    low, high = 0.0, max(point.itl_p99_s, 1e-3)
    if predicted(low) >= point.itl_p99_s:
        return 0.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < point.itl_p99_s else (low, middle)
    return low


def fit_profile(
    points: Sequence[ProfilePoint],
    *,
    prompt_tokens: int,
    kv_capacity_tokens: int,
    max_num_seqs: int,
    name: str,
    source: str,
    prefill_chunk_tokens: int = 2048,
    prefix_probe: PrefixProbe | None = None,
) -> ReplicaProfile:
    """Fit a profile to a sweep (at least two load levels with measured TTFT and ITL) and a prefix probe."""
    usable = [p for p in points if p.ttft_p50_s is not None and p.itl_p50_s is not None and p.requests > 0]
    if len(usable) < 2:
        raise ValidationError(f"a profile needs at least two load levels with latencies, got {len(usable)}")
    usable.sort(key=lambda p: p.request_rate_rps)
    light = light_levels(usable)
    itl_base = float(np.median([p.itl_p50_s or 0.0 for p in light]))
    light_ttft = float(np.median([p.ttft_p50_s or 0.0 for p in light]))
    prefill_s = max(light_ttft - itl_base, 1e-4)
    running = np.array([running_seqs(p) for p in usable])
    itl = np.array([p.itl_p50_s or 0.0 for p in usable])
    excess = itl - itl_base
    denominator = float((running**2).sum())
    slope = max(float((excess * running).sum()) / denominator, 0.0) if denominator > 0 else 0.0
    slope = max(slope, tail_slope(usable, itl_base_s=itl_base, prefill_tokens_per_s=prompt_tokens / prefill_s))
    cost = 0.0
    if prefix_probe is not None:
        cost = fit_cached_token_cost(prefix_probe.cold_ttft_p50_s, prefix_probe.cached_ttft_p50_s,
                                     cached_share=prefix_probe.cached_share, fixed_s=itl_base)  # fmt: skip
    return ReplicaProfile(
        name=name,
        source=source,
        prefill_tokens_per_s=prompt_tokens / prefill_s,
        itl_base_s=itl_base,
        itl_per_seq_s=slope,
        prefill_chunk_tokens=prefill_chunk_tokens,
        kv_capacity_tokens=kv_capacity_tokens,
        max_num_seqs=max_num_seqs,
        ttft_overhead_s=0.0,
        points=tuple(usable),
        cached_token_cost=cost,
        prefix_probe=prefix_probe,
    )
