"""Turn a load sweep against one engine replica into a :class:`ReplicaProfile`.

``moeslo profile`` sends Poisson load (:mod:`harness.sweep`) at increasing rates with fixed prompt and
output lengths and records, per rate, the achieved throughput and the p50/p99 of
TTFT and ITL (:class:`ProfilePoint`).  The profile's parameters are fitted from
those points with the capacity model's own equations:

- ``itl_base_s``: the median ITL at the lightest load (a batch of about one);
- ``itl_per_seq_s``: the least-squares slope of median ITL against the running
  sequences, ``b = output tokens/s * ITL`` (Little's law);
- ``prefill_tokens_per_s``: prompt length over the lightest load's median TTFT,
  less one decode step (the first token comes after the prefill and one step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contracts.errors import ValidationError
from controller.capacity import ProfilePoint, ReplicaProfile


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


def fit_profile(
    points: Sequence[ProfilePoint],
    *,
    prompt_tokens: int,
    kv_capacity_tokens: int,
    max_num_seqs: int,
    name: str,
    source: str,
    prefill_chunk_tokens: int = 2048,
) -> ReplicaProfile:
    """Fit a profile to a sweep (at least two load levels with measured TTFT and ITL)."""
    usable = [p for p in points if p.ttft_p50_s is not None and p.itl_p50_s is not None and p.requests > 0]
    if len(usable) < 2:
        raise ValidationError(f"a profile needs at least two load levels with latencies, got {len(usable)}")
    usable.sort(key=lambda p: p.request_rate_rps)
    lightest = usable[0]
    assert lightest.itl_p50_s is not None and lightest.ttft_p50_s is not None
    itl_base = lightest.itl_p50_s
    prefill_s = max(lightest.ttft_p50_s - itl_base, 1e-4)
    running = np.array([p.output_tokens_per_s * (p.itl_p50_s or 0.0) for p in usable])
    itl = np.array([p.itl_p50_s or 0.0 for p in usable])
    excess = itl - itl_base
    denominator = float((running**2).sum())
    slope = max(float((excess * running).sum()) / denominator, 0.0) if denominator > 0 else 0.0
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
    )
