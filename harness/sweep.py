"""A load sweep: Poisson load at increasing rates against one server, a summary per rate.

``moeslo profile`` fits a replica profile to what this measures.  The sweep
stops early when no request succeeds or when p99 TTFT passes a limit (the
replica is past saturation; heavier rates teach nothing more).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.loadgen import LoadRequest, run_load, summarize


def poisson_arrivals(rate_rps: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (s) of a Poisson process over ``duration_s``."""
    if rate_rps <= 0:
        return []
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.5) + 10)
    times = np.cumsum(gaps)
    return [float(t) for t in times[times < duration_s]]


def measure_rate(
    url: str, rate_rps: float, *, duration_s: float, prompt_tokens: int, output_tokens: int, vocab_size: int,
    model: str | None, seed: int,
) -> dict[str, Any]:
    """One rate: Poisson arrivals with fixed lengths; :func:`harness.loadgen.summarize`'s figures."""
    plan = [LoadRequest(arrival_s=t, prompt_tokens=prompt_tokens, max_tokens=output_tokens)
            for t in poisson_arrivals(rate_rps, duration_s, seed)]  # fmt: skip
    began = time.monotonic()
    records = asyncio.run(run_load(url, plan, vocab_size=vocab_size, model=model, seed=seed))
    return summarize(records, wall_s=time.monotonic() - began)


def sweep_rates(
    url: str,
    rates_rps: Sequence[float],
    *,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    vocab_size: int,
    model: str | None,
    seed: int,
    ttft_limit_s: float,
    progress: Callable[[str], None] = lambda _: None,
    min_levels: int = 1,
) -> list[dict[str, Any]]:
    """Summaries of the rates that had a successful request, lightest first (at least ``min_levels``
    of them are measured even past the TTFT limit)."""
    summaries: list[dict[str, Any]] = []
    for i, rate in enumerate(rates_rps):
        stats = measure_rate(url, rate, duration_s=duration_s, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, vocab_size=vocab_size, model=model, seed=seed + i)
        if not stats["ok"]:
            progress(f"rate {rate:g}: no request succeeded ({stats['status_counts']}); stopping")
            break
        summaries.append(stats)
        progress(f"rate {rate:g} req/s: {stats['output_tokens_per_s']:.1f} output tok/s, "
                 f"TTFT p99 {stats['ttft_p99_s']:.3f} s, ITL p99 {stats['itl_p99_s']:.4f} s")
        if (stats["ttft_p99_s"] or 0.0) > ttft_limit_s and len(summaries) >= min_levels:
            break
    return summaries


__all__ = ["measure_rate", "poisson_arrivals", "sweep_rates"]
