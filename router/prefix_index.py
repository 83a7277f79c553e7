"""What the router knows of each replica's prefix cache: the prompt blocks it sent there, least recently used first.

The router cannot see inside an engine's KV cache, but it knows every prompt
it sent: a replica that was just sent a prompt holds that prompt's blocks
until its cache needs the room.  :class:`PrefixIndex` keeps, per replica, the
chained block hashes of the prompts sent to it in LRU order, bounded by the
blocks a replica's cache is assumed to hold (the engine evicts in LRU order
too).  llm-d's approximate prefix-cache scorer estimates the same way.

:func:`with_cached_tokens` fills each replica state's ``cached_prompt_tokens``
for one request: its leading blocks the replica was sent and has not evicted
(chained hashes: block *k* matching means the whole prefix up to *k* does).
The cost policy then predicts prefill for the rest only, so a prompt goes to
the replica holding its prefix unless that replica's queue costs more than
the recompute saves.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from router.types import ReplicaState, RequestFeatures


class PrefixIndex:
    """Per replica, the block hashes sent to it, at most ``capacity_blocks`` of them (LRU)."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def cached_blocks(self, replica: str, blocks: Sequence[int]) -> int:
        """How many of ``blocks``, from the first, the replica was sent and still holds."""
        held = self._blocks.get(replica)
        if not held:
            return 0
        count = 0
        for block in blocks:
            if block not in held:
                break
            count += 1
        return count

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        """The replica was sent a prompt with these leading blocks: they are now its most recent."""
        if not blocks:
            return
        held = self._blocks.setdefault(replica, OrderedDict())
        for block in blocks:
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)

    def forget(self, replica: str) -> None:
        """The replica's cache is gone (removed, or ejected: a restarted engine starts empty)."""
        self._blocks.pop(replica, None)

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget every replica not in ``replicas``."""
        keep = set(replicas)
        for name in [n for n in self._blocks if n not in keep]:
            del self._blocks[name]

    def blocks_held(self, replica: str) -> int:
        return len(self._blocks.get(replica, ()))


def with_cached_tokens(
    states: Sequence[ReplicaState], features: RequestFeatures, index: PrefixIndex
) -> tuple[ReplicaState, ...]:
    """``states`` with ``cached_prompt_tokens`` set for this request (unchanged without prefix blocks)."""
    if not features.prefix_blocks:
        return tuple(states)
    out = []
    for state in states:
        cached = index.cached_blocks(state.name, features.prefix_blocks) * features.block_tokens
        out.append(dataclasses.replace(state, cached_prompt_tokens=cached) if cached else state)
    return tuple(out)


__all__ = ["PrefixIndex", "with_cached_tokens"]
