"""The expert GEMMs, decode-sized (one grouped kernel) and prefill-sized (a GEMM per slot), against one
expert at a time; the replica table's split of an expert's tokens over its replicas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from contracts.placement import Placement
from engine.experts import GROUPED_MM_MAX_ROWS, ReplicaTable, grouped_swiglu


def _reference(xs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    rows = []
    for x, slot in zip(xs, slots.tolist(), strict=True):
        gate, up = (x @ w13[slot]).chunk(2)
        rows.append((F.silu(gate) * up) @ w2[slot])
    return torch.stack(rows)


@pytest.mark.parametrize("rows", [1, 4, 16, GROUPED_MM_MAX_ROWS, GROUPED_MM_MAX_ROWS + 1])
def test_the_slot_gemms_match_one_expert_at_a_time_on_both_sides_of_the_threshold(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    slots_count, hidden, inter = 8, 32, 16
    w13 = torch.randn(slots_count, hidden, 2 * inter, generator=generator) / hidden**0.5  # outputs of order 1
    w2 = torch.randn(slots_count, inter, hidden, generator=generator) / inter**0.5
    slots = torch.randint(0, slots_count, (rows,), generator=generator).sort().values  # rows sorted by slot
    xs = torch.randn(rows, hidden, generator=generator)
    counts = torch.bincount(slots, minlength=slots_count)
    expected = _reference(xs, w13, w2, slots)
    assert torch.allclose(grouped_swiglu(xs, w13, w2, counts), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_layers", [2, 3, 4])
def test_every_layer_splits_an_experts_tokens_evenly_over_its_replicas(num_layers: int) -> None:
    # Expert 0 has replicas in slot 0 (rank 0) and slot 3 (rank 1); expert 1 in slots 1 and 5, expert 2 one.
    placement = Placement(np.array([[0, 1, 2, 0, 3, 1]] * num_layers), 2)
    table = ReplicaTable(placement, num_experts=4)
    hits = np.zeros((num_layers, 6), dtype=np.int64)
    generator = torch.Generator().manual_seed(num_layers)
    for step in range(300):  # the model calls physical() once per MoE layer per step
        batch = [[0]] if step < 100 else torch.randint(0, 4, (int(step % 5) + 1, 2), generator=generator).tolist()
        for layer in range(num_layers):
            slots = table.physical(layer, torch.tensor(batch)).reshape(-1)
            hits[layer] += np.bincount(slots.numpy(), minlength=6)
    for layer in range(num_layers):
        assert abs(hits[layer, 0] - hits[layer, 3]) <= 1, hits[layer]
        assert abs(hits[layer, 1] - hits[layer, 5]) <= 1, hits[layer]
