"""What a prefix-cache hit saves: TTFT of cold prompts against prompts whose start is cached.

One request at a time (an idle replica), all of the same length: a priming request
puts a shared prefix (``shared_share`` of the prompt, random tokens of its own) into
the prefix cache, then pairs follow, each a prompt that starts with that prefix and
ends in fresh tokens, and a cold prompt that shares nothing with anything sent
before (tokens are drawn afresh on every run, so not even with an earlier run's).
Interleaving the two kinds spreads any drift of the machine over both.

The share of each cached-kind prompt the engine actually found in its cache (only
whole KV blocks are cached) is read from its counters, ``vllm:prefix_cache_hits``
before and after the pairs (cold prompts add no hits, being random); an engine
without them is taken at the share sent.  :func:`controller.profiling.fit_cached_token_cost`
turns the two median TTFTs into the profile's ``cached_token_cost``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import PREFIX_CACHE_HITS
from harness.loadgen import LoadRequest, percentile, send_request
from harness.sweep import fresh_seed

__all__ = ["PROBE_PAIRS", "SHARED_SHARE", "prefix_probe"]

PROBE_PAIRS = 10
"""Requests of each kind (cold, cached) after the priming one."""
SHARED_SHARE = 0.75
"""Share of a cached-kind prompt that is the common prefix."""


async def _hits(client: httpx.AsyncClient) -> float | None:
    """The engine's cumulative prefix-cache hits (tokens), or None when it does not export them."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    total = None
    for family in text_string_to_metric_families(response.text):
        if family.name == PREFIX_CACHE_HITS:
            total = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def prefix_probe(
    url: str,
    *,
    prompt_tokens: int,
    vocab_size: int,
    model: str | None,
    seed: int,
    pairs: int = PROBE_PAIRS,
    shared_share: float = SHARED_SHARE,
) -> dict[str, Any]:
    """Median TTFTs of ``pairs`` cold and ``pairs`` cached-prefix prompts of ``prompt_tokens`` tokens.

    Returns the TTFTs of each kind, their medians (None when none succeeded), the prefix's tokens
    and ``cached_share``: the share of each cached-kind prompt the engine served from its cache.
    """
    shared = min(max(round(prompt_tokens * shared_share), 1), prompt_tokens - 1)
    rng = np.random.default_rng([seed, 2, fresh_seed()])  # fresh on every run: no prompt of an earlier one
    prefix = rng.integers(0, vocab_size, size=shared).tolist()

    def fresh(tokens: int) -> list[int]:
        return list(rng.integers(0, vocab_size, size=tokens).tolist())

    async def run() -> dict[str, Any]:
        request = LoadRequest(arrival_s=0.0, prompt_tokens=prompt_tokens, max_tokens=1)
        ttfts: dict[str, list[float]] = {"cold": [], "cached": []}
        async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:

            async def ttft(prompt: list[int]) -> float | None:
                record = await send_request(client, request, prompt, time.monotonic(), model, 0.0)
                return record.ttft_s if record.ok else None

            await ttft(prefix + fresh(prompt_tokens - shared))  # primes the cache; not measured
            before = await _hits(client)
            for _ in range(pairs):  # the cold one last, so the cached one's hits are counted by the end
                for kind, prompt in (("cached", prefix + fresh(prompt_tokens - shared)),
                                     ("cold", fresh(prompt_tokens))):  # fmt: skip
                    value = await ttft(prompt)
                    if value is not None:
                        ttfts[kind].append(value)
            after = await _hits(client)
        measured = None
        # Over every cached-kind request only when all succeeded: one that failed after its prefill still hit the
        # cache, and dividing by the successful ones alone read the share high.
        if before is not None and after is not None and len(ttfts["cached"]) == pairs:
            measured = (after - before) / (pairs * prompt_tokens)
        return {
            "cold_ttft_s": ttfts["cold"],
            "cached_ttft_s": ttfts["cached"],
            "cold_ttft_p50_s": percentile(ttfts["cold"], 50),
            "cached_ttft_p50_s": percentile(ttfts["cached"], 50),
            "shared_tokens": shared,
            "cached_share": min(max(measured, 0.0), 1.0) if measured is not None else shared / prompt_tokens,
            "cached_share_source": "engine counters" if measured is not None else "as sent",
        }

    return asyncio.run(run())
