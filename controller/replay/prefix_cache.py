"""Prefix reuse in the replay: each simulated replica's KV blocks, kept in LRU order.

For traces whose requests name their prompt's KV blocks (Mooncake's ``hash_ids``,
512 tokens a block, a block's ID standing for it and its whole prefix), every
replica keeps the blocks of the prompts it prefilled, up to its KV capacity
(``kv_capacity_tokens // block``), and evicts the least recently used first, as
vLLM's automatic prefix caching does with free cached blocks.  A request's
leading blocks found there are not prefilled again: its prefill costs only its
uncached tokens (at least one: the last token is always computed).  Only full
blocks are cached, so a prompt's partial last block never hits.

This ignores that running requests hold blocks the cache cannot use meanwhile:
the whole KV capacity counts as cache, an upper bound on what a replica keeps.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from contracts.traces import PREFIX_BLOCK_TOKENS, IntArray

__all__ = ["BlockCache", "best_case_uncached", "pooled_hit_rate"]


class BlockCache:
    """One replica's cached prefix blocks, least recently used first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(capacity_blocks, 0)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, blocks: IntArray, prompt_tokens: int) -> int:
        """Tokens of the prompt's leading full blocks this replica holds (not prefilled again)."""
        cached = self._blocks
        hit = 0
        for block in blocks.tolist():
            if block not in cached:
                break
            hit += 1
        return _usable(hit, prompt_tokens)

    def admit(self, blocks: IntArray, prompt_tokens: int) -> None:
        """The prompt was prefilled here: its full blocks become the most recently used, its first block most of
        all (a hit needs the leading blocks, so the tail goes first, as vLLM frees a request's blocks)."""
        cached = self._blocks
        for block in reversed(blocks[: prompt_tokens // PREFIX_BLOCK_TOKENS].tolist()):
            if block in cached:
                cached.move_to_end(block)
            else:
                cached[block] = None
        while len(cached) > self.capacity_blocks:
            cached.popitem(last=False)


def _usable(hit_blocks: int, prompt_tokens: int) -> int:
    full = prompt_tokens // PREFIX_BLOCK_TOKENS
    return max(min(min(hit_blocks, full) * PREFIX_BLOCK_TOKENS, prompt_tokens - 1), 0)


def best_case_uncached(prompts: IntArray, prefix_blocks: tuple[IntArray, ...] | None) -> IntArray:
    """Per request, the tokens left to prefill if every earlier prompt's blocks were still cached somewhere.

    No fleet can do better, so a request is infeasible when even these tokens, prefilled on an
    idle replica, miss its objective.
    """
    if prefix_blocks is None:
        return prompts
    seen: set[int] = set()
    out = np.empty(len(prompts), dtype=np.int64)
    for i, (blocks, prompt) in enumerate(zip(prefix_blocks, prompts.tolist(), strict=True)):
        hit = 0
        listed = blocks.tolist()
        for block in listed:
            if block not in seen:
                break
            hit += 1
        out[i] = prompt - _usable(hit, prompt)
        seen.update(listed[: prompt // PREFIX_BLOCK_TOKENS])
    return out


def pooled_hit_rate(prompts: IntArray, prefix_blocks: tuple[IntArray, ...] | None, capacity_blocks: int) -> float:
    """Share of prompt tokens one LRU cache of ``capacity_blocks`` would serve over the whole trace.

    The oracle's estimate of the fleet's hit rate: a fleet of N replicas routing by cache
    affinity behaves about like one cache N times as large.
    """
    if prefix_blocks is None or len(prompts) == 0:
        return 0.0
    cache = BlockCache(capacity_blocks)
    hits = 0
    for blocks, prompt in zip(prefix_blocks, prompts.tolist(), strict=True):
        hits += cache.cached_tokens(blocks, prompt)
        cache.admit(blocks, prompt)
    return hits / max(float(prompts.sum()), 1.0)
