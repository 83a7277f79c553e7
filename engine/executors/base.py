"""What every executor shares: its options, the interface the scheduler drives, and the driver.

An executor owns the model weights, the KV cache tensors and the expert
placement.  The driver (rank 0, :class:`DriverBase`) owns the non-expert
model, the KV cache, the replica table and the routing statistics;
subclasses decide where expert MLPs run (``engine.executors.local``: all in
this process; ``engine.executors.multiproc``: across EP rank processes).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from contracts.errors import PlacementError, ValidationError
from contracts.placement import Placement
from engine.batch import StepPlan
from engine.checkpoint import CheckpointReader, torch_dtype
from engine.config import ModelConfig
from engine.executors.options import Executor, ExecutorOptions, default_threads
from engine.experts import ReplicaTable
from engine.model import Qwen3MoeModel, StepMetadata
from engine.stats import PlacementSwapStats, RoutingDelta


def use_step_threads(tokens: int, threads: int, min_tokens: int) -> None:
    """Run the coming step on ``threads`` if it has ``min_tokens`` tokens or more, else on one: a small
    step's many parallel regions would each wait for sleeping OpenMP workers to wake
    (``engine.executors.options.PARALLEL_MIN_TOKENS``)."""
    wanted = threads if tokens >= min_tokens else 1
    if torch.get_num_threads() != wanted:  # the process's setting: whoever embeds us may change it too
        torch.set_num_threads(wanted)


def kv_cache_blocks(config: ModelConfig, kv_cache_mb: float, block_size: int, dtype: torch.dtype) -> int:
    """KV blocks that fit the budget; raises if fewer than one sequence of one block fits."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_block = config.num_hidden_layers * 2 * block_size * config.num_key_value_heads * config.head_dim * elem
    blocks = int(kv_cache_mb * 2**20 // per_block)
    if blocks < 2:
        raise ValidationError(
            f"kv_cache_mb={kv_cache_mb} holds {blocks} blocks of {per_block} bytes; need at least 2"
        )
    return blocks


class DriverBase:
    """Rank-0 logic: model, KV cache, placement bookkeeping and routing counts."""

    def __init__(self, options: ExecutorOptions, num_ranks: int) -> None:
        self.options = options
        self._config = ModelConfig.load(options.checkpoint)
        self.dtype = torch_dtype(options.dtype or self._config.torch_dtype)
        self._num_ranks = num_ranks
        self._block_size = options.block_size
        if options.block_size < 1:
            raise ValidationError(f"block_size must be >= 1, got {options.block_size}")
        if options.parallel_min_tokens < 0:
            raise ValidationError(f"parallel_min_tokens must be >= 0, got {options.parallel_min_tokens}")
        self._threads = torch.get_num_threads()
        """The threads a large step runs on (the subclass set them before this)."""
        self._num_blocks = kv_cache_blocks(self._config, options.kv_cache_mb, options.block_size, self.dtype)
        cfg = self._config
        self.moe_layers = len(cfg.sparse_layers)
        placement = options.placement or Placement.contiguous(
            self.moe_layers, cfg.num_experts, num_ranks, options.slots_per_rank
        )
        placement.validate(num_layers=self.moe_layers, num_experts=cfg.num_experts, num_ranks=num_ranks)
        self._placement = placement
        self.replicas = ReplicaTable(placement, cfg.num_experts)
        self.reader = CheckpointReader(options.checkpoint, self.dtype)
        self.model = Qwen3MoeModel(cfg, self.reader, self.dtype)
        self.kv_cache = torch.zeros(
            (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, self._num_blocks, self._block_size, cfg.head_dim),
            dtype=self.dtype,
        )
        self._routing_on = options.routing_stats
        self._num_slots = placement.num_slots
        self._slot_counts = torch.zeros((self.moe_layers, self._num_slots), dtype=torch.long)
        """Assignments routed to each physical slot since the last fold (stays a tensor: no per-step copy)."""
        self._expert_acc = np.zeros((self.moe_layers, cfg.num_experts), dtype=np.int64)
        self._rank_acc = np.zeros((self.moe_layers, num_ranks), dtype=np.int64)
        self._steps = 0

    # ---------------------------------------------------------- Executor API
    @property
    def config(self) -> ModelConfig:
        return self._config

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_ranks(self) -> int:
        return self._num_ranks

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def broken(self) -> str | None:
        """Why this executor can no longer run steps (None: healthy)."""
        return None

    def execute(self, plan: StepPlan) -> torch.Tensor:
        if not plan.chunks:
            return torch.empty((0, self._config.vocab_size))
        meta = self.model.step_metadata(plan, self._block_size, self._num_blocks)
        if self._routing_on:
            self._steps += 1
        use_step_threads(plan.num_tokens, self._threads, self.options.parallel_min_tokens)
        with torch.inference_mode():
            return self._forward(meta)

    def _forward(self, meta: StepMetadata) -> torch.Tensor:
        return self.model.forward(meta, self.kv_cache, self._experts)

    def _experts(self, layer: int, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        physical = self.replicas.physical(layer, expert_ids)
        # One bincount over the physical slots per MoE layer: the routing statistics (a counter that stays
        # in a tensor until take_routing reads it) and, in one process, the expert grouping too.
        counts = torch.bincount(physical.reshape(-1), minlength=self._num_slots)
        if self._routing_on:
            self._slot_counts[layer] += counts
        return self._dispatch(layer, x, weights, physical, counts)

    def _dispatch(
        self, layer: int, x: torch.Tensor, weights: torch.Tensor, physical: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError

    def _fold(self) -> None:
        """Turn the slot counters into logical-expert and rank counts under the current placement."""
        slots = self._slot_counts.numpy().copy()
        self._slot_counts.zero_()
        placement = self._placement
        experts = self._config.num_experts
        for layer in range(placement.num_layers):
            self._expert_acc[layer] += np.bincount(placement.phy2log[layer], weights=slots[layer],
                                                   minlength=experts).astype(np.int64)
        self._rank_acc += slots.reshape(placement.num_layers, self._num_ranks, -1).sum(axis=2)

    def take_routing(self) -> RoutingDelta | None:
        if not self._routing_on:
            return None
        self._fold()
        delta = RoutingDelta(expert_tokens=self._expert_acc.copy(), rank_tokens=self._rank_acc.copy(),
                             steps=self._steps)
        self._reset_routing()
        return delta

    def _reset_routing(self) -> None:
        self._slot_counts.zero_()
        self._expert_acc[:] = 0
        self._rank_acc[:] = 0
        self._steps = 0

    def set_routing_stats(self, enabled: bool) -> None:
        self._routing_on = enabled
        self._reset_routing()

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        cfg = self._config
        placement.validate(num_layers=self.moe_layers, num_experts=cfg.num_experts, num_ranks=self._num_ranks)
        if placement.slots_per_rank != self._placement.slots_per_rank:
            raise PlacementError(
                f"placement has {placement.slots_per_rank} slots per rank; this engine was started with "
                f"{self._placement.slots_per_rank}"
            )
        start = time.monotonic()
        if self._routing_on:
            self._fold()  # counts routed so far belong to the old placement
        with torch.inference_mode():
            moved, moved_bytes = self._swap(placement)
        self._placement = placement
        self.replicas = ReplicaTable(placement, cfg.num_experts)
        return PlacementSwapStats(
            duration_s=time.monotonic() - start, experts_moved=moved, bytes_moved=moved_bytes
        )

    def _swap(self, placement: Placement) -> tuple[int, int]:
        raise NotImplementedError

    def shutdown(self) -> None:
        self.reader.close()


def expert_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 3 * config.hidden_size * config.moe_intermediate_size * elem


__all__ = [
    "DriverBase", "Executor", "ExecutorOptions", "default_threads", "expert_bytes", "kv_cache_blocks",
    "use_step_threads",
]
