"""Routed-token counts per (MoE layer, logical expert), kept on the model's device.

:meth:`ExpertLoadCounter.capture` is what vLLM's router calls (through
``BaseRouter.set_capture_fn``) with the logical expert ids of each token,
before EPLB maps them to physical slots.  It adds them to a device tensor
without a host sync (``index_add_`` with 0/1 weights, so padding rows and
invalid ids cost nothing and never leave the device); a background thread
copies the tensor out once per flush interval.

Which rows count is decided by a :class:`RowFilter` the caller supplies
(vLLM's forward context in production), so this module needs torch only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from engine.stats import IntArray

RowFilter = Callable[[torch.Tensor], "tuple[int, int] | torch.Tensor | None"]
"""Given ``topk_ids`` (tokens x k): the rows to count, as a ``(start, end)`` span (cheap) or a bool
mask on the ids' device (sync-free on accelerators), or None to skip the call."""


def count_all_rows(topk_ids: torch.Tensor) -> tuple[int, int] | torch.Tensor | None:
    """The filter for tests and offline use: every row counts."""
    return (0, int(topk_ids.shape[0]))


_COUNTERS: dict[int, ExpertLoadCounter] = {}


@torch.library.custom_op("moeslo::count_routed", mutates_args=("counts",))
def _count_routed(counts: torch.Tensor, topk_ids: torch.Tensor, counter_id: int, row: int) -> None:
    """The callback as an opaque op, for compiled graphs (vLLM traces the CPU MoE path with
    ``fullgraph=True``): the graph keeps a call that runs our Python at run time, when the
    forward context is real.  ``counts`` (the counter's device tensor) is declared mutated so
    the call is never dead-code eliminated."""
    _COUNTERS[counter_id].capture_eager(row, topk_ids)


@_count_routed.register_fake
def _count_routed_fake(counts: torch.Tensor, topk_ids: torch.Tensor, counter_id: int, row: int) -> None:
    return None


class ExpertLoadCounter:
    """Cumulative routed-token counts for the MoE layers one worker runs.

    Two paths, both exact: ids on the CPU with a row span are counted with
    ``numpy.bincount`` into a host array (a few microseconds per call);
    anything else (an accelerator, or a row mask) with ``index_add_`` into a
    device tensor, so the forward pass never waits for the host.
    """

    def __init__(
        self,
        layer_ids: Sequence[int],
        num_experts: int,
        *,
        device: torch.device | str = "cpu",
        row_filter: RowFilter = count_all_rows,
    ) -> None:
        if len(set(layer_ids)) != len(layer_ids):
            raise ValueError(f"duplicate MoE layer ids: {sorted(layer_ids)}")
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        self.layer_ids: tuple[int, ...] = tuple(sorted(layer_ids))
        self.num_experts = num_experts
        self._row_of_layer = {layer: row for row, layer in enumerate(self.layer_ids)}
        self._host: IntArray = np.zeros((len(self.layer_ids), num_experts), dtype=np.int64)
        self._device = torch.zeros((len(self.layer_ids), num_experts), dtype=torch.int64, device=device)
        self._row_filter = row_filter
        self._lock = threading.Lock()
        self.skipped_calls = 0
        """Capture calls the row filter rejected (profile and warm-up runs, odd batch layouts)."""

    def capture_fn(self, layer_id: int) -> Callable[[torch.Tensor], None]:
        """The callback to hand to one layer's router."""
        row = self._row_of_layer[layer_id]

        _COUNTERS[id(self)] = self
        counter_id = id(self)

        def capture(topk_ids: torch.Tensor) -> None:
            if torch.compiler.is_compiling():
                torch.ops.moeslo.count_routed(self._device, topk_ids, counter_id, row)
            else:
                self.capture_eager(row, topk_ids)

        return capture

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        self.capture_eager(self._row_of_layer[layer_id], topk_ids)

    def capture_eager(self, row: int, topk_ids: torch.Tensor) -> None:
        if topk_ids.numel() == 0:
            return
        rows = self._row_filter(topk_ids)
        if rows is None:
            self.skipped_calls += 1
            return
        experts = self.num_experts
        if isinstance(rows, tuple) and topk_ids.device.type == "cpu":
            ids = topk_ids.numpy()[rows[0] : rows[1]].reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= experts):
                # Routes a router invalidated (-1), or ids no expert has: bincount would size its output to
                # the largest id (an id of 2**40 asked for 8 TiB).
                ids = ids[(ids >= 0) & (ids < experts)]
            counts = np.bincount(ids, minlength=experts)
            with self._lock:
                self._host[row] += counts
            return
        if isinstance(rows, tuple):
            keep = torch.zeros(topk_ids.shape[0], dtype=torch.bool, device=topk_ids.device)
            keep[rows[0] : rows[1]] = True
        else:
            keep = rows
        ids64 = topk_ids.to(torch.int64)
        valid = (ids64 >= 0) & (ids64 < experts) & keep.view(-1, 1)
        # Weights of 0 drop padding rows and invalid ids without a device-to-host sync.
        with self._lock:
            self._device[row].index_add_(0, ids64.clamp(0, experts - 1).view(-1), valid.view(-1).long())

    def snapshot(self) -> IntArray:
        """(layers, experts) cumulative counts, copied to the host."""
        with self._lock:
            host = self._host.copy()
            device = self._device.clone()
        return host + np.asarray(device.cpu().numpy(), dtype=np.int64)
