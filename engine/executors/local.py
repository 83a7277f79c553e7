"""The single-process executor (``--ep 1``): every expert MLP runs in this process."""

from __future__ import annotations

import torch

from contracts.errors import PlacementError
from contracts.placement import Placement
from engine.executors.base import DriverBase, ExecutorOptions, default_threads
from engine.experts import ExpertShard, load_expert


class LocalExecutor(DriverBase):
    """Every expert in this process (one EP rank)."""

    def __init__(self, options: ExecutorOptions) -> None:
        torch.set_num_threads(options.threads_per_rank or default_threads(1))
        super().__init__(options, num_ranks=1)
        self.shard = ExpertShard(
            self._config, self._placement, 0,
            lambda layer, expert: load_expert(self.reader, self._config.sparse_layers[layer], expert),
        )

    def _dispatch(
        self, layer: int, x: torch.Tensor, weights: torch.Tensor, physical: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        self.shard.compute(layer, x, weights, physical, out, counts)
        return out

    def _swap(self, placement: Placement) -> tuple[int, int]:
        # One rank holds every expert already: slots are only reordered, nothing changes rank.
        try:
            layers = self.shard.prepare(placement, {})
        except Exception as exc:  # e.g. MemoryError while building the new slots aside
            raise PlacementError(f"placement swap failed ({exc!r}); the old placement stays") from exc
        self.shard.commit(placement, layers)
        return 0, 0


__all__ = ["LocalExecutor"]
