"""The paged KV cache's bookkeeping: fixed-size blocks, free pools, block tables, the prefix cache.

The executor owns the KV tensors (``num_blocks x block_size`` token slots per
layer); this module only decides which block ids each sequence holds.  The
number of blocks is fixed when the engine starts (``--kv-cache-mb``), so the
cache's memory never grows with load: when blocks run out the scheduler
preempts a sequence (frees its blocks and recomputes it later).

Prefix caching (vLLM's automatic prefix caching): once a block is allocated
to a step that fills it with computed tokens, it is keyed by a hash chained over its tokens and its parent
block's hash, so equal keys mean equal token prefixes.  Blocks carry
reference counts; a sequence whose leading full blocks match cached keys
takes those blocks (count + 1) instead of computing them again.  A freed
block keeps its key and joins a least-recently-used pool; it is evicted (its
key dropped, its slots reused) only when an allocation finds no block free
without a key.  A block in use (count > 0) is never in a free pool, so never
evicted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from contracts.errors import ValidationError

ROOT_BLOCK_HASH = hashlib.sha256(b"moeslo prefix cache root").digest()
"""The parent key of a sequence's first block."""


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The key of a full block: SHA-256 over its parent's key and its token ids.

    A cryptographic hash (vLLM's default too) so that a collision, which
    would silently serve another prompt's KV, is out of reach.
    """
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def extend_block_hashes(
    hashes: list[bytes], tokens: Callable[[int, int], Sequence[int]], num_tokens: int, block_size: int
) -> None:
    """Append the keys of the full blocks among the first ``num_tokens`` tokens not hashed yet.

    ``tokens(start, stop)`` gives the sequence's tokens ``start:stop``; keys
    only depend on tokens, so a sequence's list stays valid as it grows.
    """
    for index in range(len(hashes), num_tokens // block_size):
        parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
        hashes.append(hash_block(parent, tokens(index * block_size, (index + 1) * block_size)))


class BlockManager:
    """Per-sequence block tables over a fixed pool of KV blocks, with an optional prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False) -> None:
        problems = []
        if num_blocks < 1:
            problems.append(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            problems.append(f"block_size must be >= 1, got {block_size}")
        if problems:
            raise ValidationError(problems)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Free blocks without a key: a stack, the most recently freed reused first (warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Free blocks with a key, least recently freed first: the eviction order.
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._ref = [0] * num_blocks
        self._key: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        self._tables: dict[int, list[int]] = {}
        self._num_keyed: dict[int, int] = {}
        """Per sequence: leading blocks of its table already keyed (taken from the cache or registered)."""

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: free ones and evictable cached ones."""
        return len(self._free) + len(self._free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding a key (in use or free)."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (``vllm:kv_cache_usage_perc``; cached free blocks count as free)."""
        return self.num_used / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """The longest sequence the whole cache can hold."""
        return self.num_blocks * self.block_size

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._tables.get(seq_id, ()))

    def num_blocks_of(self, seq_id: int) -> int:
        return len(self._tables.get(seq_id, ()))

    def num_keyed(self, seq_id: int) -> int:
        """Leading blocks of ``seq_id``'s table already keyed (taken from the cache or registered)."""
        return self._num_keyed.get(seq_id, 0)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def extra_blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """Blocks to add so that ``seq_id`` holds ``num_tokens`` tokens."""
        return max(0, blocks_for_tokens(num_tokens, self.block_size) - self.num_blocks_of(seq_id))

    def can_hold(self, seq_id: int, num_tokens: int) -> bool:
        return self.extra_blocks_needed(seq_id, num_tokens) <= self.num_free

    def ensure(self, seq_id: int, num_tokens: int) -> bool:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens.

        All or nothing: returns False and allocates nothing when too few
        blocks are free.  Blocks without a key go first; a cached free block
        is evicted only when none is left.
        """
        extra = self.extra_blocks_needed(seq_id, num_tokens)
        if extra > self.num_free:
            return False
        if extra:
            table = self._tables.setdefault(seq_id, [])
            for _ in range(extra):
                block = self._free.pop() if self._free else self._evict()
                self._ref[block] = 1
                table.append(block)
        return True

    def _evict(self) -> int:
        block, _ = self._free_cached.popitem(last=False)
        key = self._key[block]
        assert key is not None
        del self._cached[key]
        self._key[block] = None
        return block

    # ----------------------------------------------------------------- prefix cache

    def cached_prefix(self, hashes: Sequence[bytes], max_blocks: int) -> list[int]:
        """Blocks holding the longest cached run of the leading keys ``hashes[:max_blocks]``."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        for key in hashes[:max_blocks]:
            block = self._cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free pool (taking them shrinks what allocations may use)."""
        return sum(1 for block in blocks if self._ref[block] == 0)

    def take_cached(self, seq_id: int, blocks: Sequence[int]) -> None:
        """Start ``seq_id``'s (empty) table with cached ``blocks``, one more reference each."""
        if self._tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} already holds blocks; cached blocks only start a table")
        for block in blocks:
            if self._ref[block] == 0:
                del self._free_cached[block]
            self._ref[block] += 1
        self._tables[seq_id] = list(blocks)
        self._num_keyed[seq_id] = len(blocks)

    def cache_full_blocks(self, seq_id: int, hashes: Sequence[bytes], num_computed: int) -> None:
        """Key ``seq_id``'s blocks that are full of computed tokens, or will be once the step being planned
        has run (``hashes`` covers them).

        A block whose key another block already holds (two equal prompts
        computed side by side) stays unkeyed: one copy per key.
        """
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(seq_id)
        if not table:
            return
        full = min(num_computed // self.block_size, len(table), len(hashes))
        for index in range(self._num_keyed.get(seq_id, 0), full):
            block, key = table[index], hashes[index]
            if self._key[block] is None and key not in self._cached:
                self._key[block] = key
                self._cached[key] = block
        self._num_keyed[seq_id] = max(full, self._num_keyed.get(seq_id, 0))

    def drop_keys(self, seq_id: int, first: int) -> None:
        """Drop the keys of ``seq_id``'s blocks from table index ``first`` on (their KV was never written)."""
        table = self._tables.get(seq_id, [])
        for block in table[first:]:
            key = self._key[block]
            if key is not None:  # in use by seq_id, so in no free pool
                del self._cached[key]
                self._key[block] = None
        if self._num_keyed.get(seq_id, 0) > first:
            self._num_keyed[seq_id] = first

    def reset_prefix_cache(self) -> int:
        """Drop the keys of every free cached block; the number dropped (blocks in use keep theirs)."""
        dropped = len(self._free_cached)
        while self._free_cached:
            self._free.append(self._evict())
        return dropped

    # ----------------------------------------------------------------- release

    def free(self, seq_id: int) -> int:
        """Drop ``seq_id``'s references; the number of blocks it held.

        The last holder's blocks go back to the pools, in reverse table order
        so that a sequence's tail blocks are evicted before its head (vLLM's
        order: heads are the ones other prompts share).
        """
        self._num_keyed.pop(seq_id, None)
        table = self._tables.pop(seq_id, None)
        if not table:
            return 0
        for block in reversed(table):
            self._ref[block] -= 1
            if self._ref[block]:
                continue
            if self._key[block] is None:
                self._free.append(block)
            else:
                self._free_cached[block] = None
        return len(table)

    def holders(self) -> list[int]:
        """Sequence ids that hold at least one block."""
        return [seq_id for seq_id, table in self._tables.items() if table]

    def check_invariants(self) -> None:
        """Every block is free, cached-free, or referenced exactly as often as tables name it (tests call this)."""
        counts = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"sequence {seq_id} names a block twice: {table}")
            for block in table:
                counts[block] += 1
        problems = []
        free, free_cached = set(self._free), set(self._free_cached)
        if len(free) != len(self._free) or free & free_cached:
            problems.append("a block is in a free pool twice")
        for block in range(self.num_blocks):
            key, ref = self._key[block], self._ref[block]
            if ref != counts[block]:
                problems.append(f"block {block}: count {ref}, named by {counts[block]} tables")
            if ref == 0 and (block in free) + (block in free_cached) != 1:
                problems.append(f"block {block}: unreferenced but not in exactly one free pool")
            if ref > 0 and (block in free or block in free_cached):
                problems.append(f"block {block}: in use and free")
            if (block in free and key is not None) or (block in free_cached and key is None):
                problems.append(f"block {block}: in the wrong free pool for its key")
            if key is not None and self._cached.get(key) != block:
                problems.append(f"block {block}: its key names another block")
        if len(self._cached) != sum(1 for key in self._key if key is not None):
            problems.append("the key index names blocks that hold no key")
        if problems:
            raise AssertionError("block accounting broken: " + "; ".join(problems[:5]))


__all__ = ["ROOT_BLOCK_HASH", "BlockManager", "blocks_for_tokens", "extend_block_hashes", "hash_block"]
