"""The expert GEMMs, decode-sized (one grouped kernel) and prefill-sized (a GEMM per slot), against one
expert at a time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.experts import GROUPED_MM_MAX_ROWS, grouped_swiglu


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
