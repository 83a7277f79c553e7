"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, block tables.

The executor owns the KV tensors (``num_blocks x block_size`` token slots per
layer); this module only decides which block ids each sequence holds.  The
number of blocks is fixed when the engine starts (``--kv-cache-mb``), so the
cache's memory never grows with load: when blocks run out the scheduler
preempts a sequence (frees its blocks and recomputes it later).
"""

from __future__ import annotations

from contracts.errors import ValidationError


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


class BlockManager:
    """Per-sequence block tables over a fixed pool of KV blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        problems = []
        if num_blocks < 1:
            problems.append(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            problems.append(f"block_size must be >= 1, got {block_size}")
        if problems:
            raise ValidationError(problems)
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack: the most recently freed block is reused first (it is warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (``vllm:kv_cache_usage_perc``)."""
        return self.num_used / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """The longest sequence the whole cache can hold."""
        return self.num_blocks * self.block_size

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._tables.get(seq_id, ()))

    def num_blocks_of(self, seq_id: int) -> int:
        return len(self._tables.get(seq_id, ()))

    def extra_blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """Blocks to add so that ``seq_id`` holds ``num_tokens`` tokens."""
        return max(0, blocks_for_tokens(num_tokens, self.block_size) - self.num_blocks_of(seq_id))

    def can_hold(self, seq_id: int, num_tokens: int) -> bool:
        return self.extra_blocks_needed(seq_id, num_tokens) <= len(self._free)

    def ensure(self, seq_id: int, num_tokens: int) -> bool:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens.

        All or nothing: returns False and allocates nothing when the free list
        is too short.
        """
        extra = self.extra_blocks_needed(seq_id, num_tokens)
        if extra > len(self._free):
            return False
        if extra:
            table = self._tables.setdefault(seq_id, [])
            for _ in range(extra):
                table.append(self._free.pop())
        return True

    def free(self, seq_id: int) -> int:
        """Return every block of ``seq_id`` to the free list; the number freed."""
        table = self._tables.pop(seq_id, None)
        if not table:
            return 0
        self._free.extend(reversed(table))
        return len(table)

    def holders(self) -> list[int]:
        """Sequence ids that hold at least one block."""
        return [seq_id for seq_id, table in self._tables.items() if table]

    def check_invariants(self) -> None:
        """Every block is either free or in exactly one table (tests call this)."""
        seen: list[int] = list(self._free)
        for table in self._tables.values():
            seen.extend(table)
        if sorted(seen) != list(range(self.num_blocks)):
            raise AssertionError(
                f"block accounting broken: {len(seen)} ids for {self.num_blocks} blocks, "
                f"{len(seen) - len(set(seen))} duplicated"
            )


__all__ = ["BlockManager", "blocks_for_tokens"]
