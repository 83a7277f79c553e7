"""The core's KV block pool as the API process sees it."""

from __future__ import annotations

from collections.abc import Callable


class BlocksView:
    """The core's KV block pool as the API process sees it (sizes; checks run in the core)."""

    def __init__(self, call: Callable[[str], object], num_blocks: int, block_size: int) -> None:
        """``call``: runs a method of the core between two steps (the client's ``call``)."""
        self._call = call
        self.num_blocks = num_blocks
        self.block_size = block_size

    def check_invariants(self) -> None:
        """Every block free or in exactly one table; AssertionError otherwise (tests call this)."""
        self._call("check_invariants")


__all__ = ["BlocksView"]
