"""What an executor is told (its options) and what the engine loop needs from it (the protocol).

Kept apart from :mod:`engine.executors.base` so that the API process can
name these without importing torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from contracts.placement import Placement
from engine.batch import StepPlan
from engine.config import ModelConfig
from engine.stats import PlacementSwapStats, RoutingDelta

if TYPE_CHECKING:
    import torch


PARALLEL_MIN_TOKENS = 768
"""Fewest tokens in a step that run on more than one thread.  The core's OpenMP workers sleep at barriers,
and waking them costs each of a step's few hundred parallel regions its wake-up: on 2 CPUs a 16-sequence
decode step took 22 ms on 2 threads against 8.6 ms on one, and a 512-token prefill 58 against 50 ms; from
about 1,000 tokens the second thread pays (93 against 113 ms), docs/engine.md."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorOptions:
    """How to run the model (read once at the edge: CLI or server config)."""

    checkpoint: Path
    ep: int = 1
    """Expert-parallel ranks (processes, unless ``colocate_ranks``)."""
    colocate_ranks: bool = False
    """Hold every rank's expert slots in this one process: placements, per-rank loads and rebalancing
    behave as with ``ep`` rank processes, and the experts run as one grouped kernel over all slots.
    For ranks that would share one CPU, where rank processes add only hand-offs, never parallelism."""
    kv_cache_mb: float = 64.0
    """KV cache budget per rank, fixed at start (MiB)."""
    block_size: int = 16
    """Tokens per KV block."""
    dtype: str | None = None
    """``float32`` or ``bfloat16``; None: the checkpoint's dtype."""
    slots_per_rank: int | None = None
    """Physical expert slots per rank; None: just enough for every expert once."""
    placement: Placement | None = None
    """Initial placement; None: contiguous."""
    routing_stats: bool = True
    threads_per_rank: int | None = None
    """torch intra-op threads per rank process; None: the CPUs of the inherited affinity set, divided among ranks."""
    parallel_min_tokens: int = PARALLEL_MIN_TOKENS
    """Steps with fewer tokens run on one thread, larger ones on ``threads_per_rank`` (0: every step on all)."""


class Executor(Protocol):
    """What the engine loop needs from a model executor."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def num_blocks(self) -> int:
        """KV blocks available (ids 0..num_blocks-1)."""
        ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_ranks(self) -> int: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def broken(self) -> str | None:
        """Why the executor can no longer run steps (an EP group left mid-collective); None when healthy."""
        ...

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Run one step; float32 logits (plan.num_logits, vocab), rows in chunk order."""
        ...

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        """Swap to a new placement between steps; PlacementError leaves the old one in force."""
        ...

    def take_routing(self) -> RoutingDelta | None:
        """Routed-token counts since the last call (None when routing stats are off)."""
        ...

    def set_routing_stats(self, enabled: bool) -> None: ...

    def shutdown(self) -> None: ...



def default_threads(num_ranks: int, *, reserve: int = 0) -> int:
    """torch threads per rank: the CPUs this process may run on (its affinity set), less ``reserve`` CPUs
    kept for other work (the API process), shared among the ranks; at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    if cpus > reserve:
        cpus -= reserve
    return max(1, cpus // num_ranks)


__all__ = ["PARALLEL_MIN_TOKENS", "Executor", "ExecutorOptions", "default_threads"]
