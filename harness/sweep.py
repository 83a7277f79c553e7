"""A load sweep: Poisson load at increasing rates against one server, a summary per rate.

``moeslo profile`` fits a replica profile to what this measures.  The sweep
first warms the replica up (a few requests of the same lengths, one at a time,
not measured: a replica's first request pays for allocations and lazy
initialization, and at the lightest rate it could be the level's only one), then
skips a level that draws no arrival, and stops early when a level's requests all
fail or when p99 TTFT passes a limit (the replica is past saturation; heavier
rates teach nothing more).

Prompts are fresh random tokens on every run (arrivals follow the seed): a second
profile of the same engine would otherwise send the first one's prompts again, find
them in the prefix cache and measure the prefill too fast.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np

from harness.loadgen import LoadRequest, run_load, send_request, summarize

WARMUP_REQUESTS = 3
"""Requests sent one at a time before the sweep, their results discarded."""


def poisson_arrivals(rate_rps: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (s) of a Poisson process over ``duration_s``."""
    if rate_rps <= 0:
        return []
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.5) + 10)
    times = np.cumsum(gaps)
    return [float(t) for t in times[times < duration_s]]


def fresh_seed() -> int:
    """A seed drawn from the operating system's entropy (prompts no earlier run sent)."""
    return int(np.random.SeedSequence().generate_state(1)[0])


def measure_rate(
    url: str, rate_rps: float, *, duration_s: float, prompt_tokens: int, output_tokens: int, vocab_size: int,
    model: str | None, seed: int, prompt_seed: int | None = None, lengths: Sequence[tuple[int, int]] = (),
) -> dict[str, Any]:
    """One rate: Poisson arrivals; :func:`harness.loadgen.summarize`'s figures.

    Every request has the fixed lengths, or, given ``lengths`` (prompt, output pairs), a pair drawn
    from them. Arrivals and draws follow ``seed``, prompts ``prompt_seed`` (None: ``seed`` too)."""
    arrivals = poisson_arrivals(rate_rps, duration_s, seed)
    if lengths:
        picks = np.random.default_rng([seed, 2]).integers(0, len(lengths), size=len(arrivals))
        pairs = [lengths[int(i)] for i in picks]
    else:
        pairs = [(prompt_tokens, output_tokens)] * len(arrivals)
    plan = [LoadRequest(arrival_s=t, prompt_tokens=p, max_tokens=o) for t, (p, o) in zip(arrivals, pairs, strict=True)]
    began = time.monotonic()
    prompts = seed if prompt_seed is None else prompt_seed
    records = asyncio.run(run_load(url, plan, vocab_size=vocab_size, model=model, seed=prompts))
    return summarize(records, wall_s=time.monotonic() - began)


def warm_up(
    url: str, requests: int, *, prompt_tokens: int, output_tokens: int, vocab_size: int, model: str | None, seed: int,
) -> int:
    """Send ``requests`` requests one after the other and forget them; how many succeeded.

    Their prompts come from their own random stream, so no measured prompt finds them in the prefix cache.
    """
    rng = np.random.default_rng([seed, 1, fresh_seed()])

    async def send_all() -> int:
        ok = 0
        async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:
            for _ in range(requests):
                prompt = rng.integers(0, vocab_size, size=prompt_tokens).tolist()
                req = LoadRequest(arrival_s=0.0, prompt_tokens=prompt_tokens, max_tokens=output_tokens)
                record = await send_request(client, req, prompt, time.monotonic(), model, 0.0)
                ok += record.ok
        return ok

    return asyncio.run(send_all()) if requests > 0 else 0


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
    warmup_requests: int = WARMUP_REQUESTS,
    lengths: Sequence[tuple[int, int]] = (),
    stop: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """Summaries of the rates that had a successful request, lightest first (at least ``min_levels``
    of them are measured even past the TTFT limit), after ``warmup_requests`` unmeasured ones.

    ``stop``, once set, ends the sweep before its next level (a caller interrupted)."""
    if stop is not None and stop.is_set():
        return []
    if warmup_requests > 0:
        ok = warm_up(url, warmup_requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                     vocab_size=vocab_size, model=model, seed=seed)
        progress(f"warm-up: {ok} of {warmup_requests} requests succeeded (not measured)")
    summaries: list[dict[str, Any]] = []
    prompt_seed = fresh_seed()
    for i, rate in enumerate(rates_rps):
        if stop is not None and stop.is_set():
            break
        stats = measure_rate(url, rate, duration_s=duration_s, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, vocab_size=vocab_size, model=model, seed=seed + i,
                             prompt_seed=prompt_seed + i, lengths=lengths)
        if not stats["requests"]:
            # A light, short level may draw no Poisson arrival at all (0.3 req/s for 5 s: one time in five):
            # nothing was sent, so nothing failed.
            progress(f"rate {rate:g}: no arrival drawn in {duration_s:g} s (nothing sent); skipped")
            continue
        if not stats["ok"]:
            progress(f"rate {rate:g}: no request succeeded ({stats['status_counts']}); stopping")
            break
        summaries.append({**stats, "rate_rps": rate})  # the rate asked for: replicas' levels pool by it
        progress(f"rate {rate:g} req/s: {stats['output_tokens_per_s']:.1f} output tok/s, "
                 f"TTFT p99 {_seconds(stats['ttft_p99_s'], 3)}, ITL p99 {_seconds(stats['itl_p99_s'], 4)}")
        if (stats["ttft_p99_s"] or 0.0) > ttft_limit_s and len(summaries) >= min_levels:
            break
    return summaries


def _seconds(value: float | None, digits: int) -> str:
    """A p99 for the progress line; "-" where there was nothing to measure (one-token outputs have no gaps)."""
    return "-" if value is None else f"{value:.{digits}f} s"


__all__ = ["WARMUP_REQUESTS", "fresh_seed", "measure_rate", "poisson_arrivals", "sweep_rates", "warm_up"]
