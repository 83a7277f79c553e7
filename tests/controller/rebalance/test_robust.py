"""The overload pass of history planning: hand-made cases with a known optimum, and invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controller.rebalance.robust import (
    VectorPacking,
    overload,
    refine_overload,
    refine_windows,
    replica_vectors,
    vector_lpt,
    window_counts,
    window_shares,
)

# Two windows, six single-replica experts, three ranks of two slots (loads per window).
TWO_WINDOWS = np.array([[[5.0, 4.0], [5.0, 3.0], [3.0, 4.0], [3.0, 4.0], [4.0, 3.0], [1.0, 0.0]]])


def _packed(weights: np.ndarray, ranks: int) -> VectorPacking:
    rows, slots, _ = weights.shape
    experts = np.broadcast_to(np.arange(slots, dtype=np.int64), (rows, slots)).copy()
    return vector_lpt(experts, weights, ranks, slots)


def _best_overload(weights: np.ndarray, ranks: int) -> float:
    """Brute force: the smallest summed squared overload of any placement."""
    slots = weights.shape[0]
    k = slots // ranks
    best = np.inf
    for perm in itertools.permutations(range(slots)):
        load = weights[list(perm)].reshape(ranks, k, -1).sum(axis=1)
        best = min(best, float((np.maximum(load - load.mean(axis=0), 0.0) ** 2).sum()))
    return best


def test_overload_counts_only_ranks_above_the_mean() -> None:
    packing = _packed(TWO_WINDOWS, 3)
    load = packing.rank_load[0]  # (ranks, windows); the mean is 7 then 6
    expected = (np.maximum(load - np.array([7.0, 6.0]), 0.0) ** 2).sum()
    assert overload(packing)[0] == pytest.approx(expected)


def test_the_pass_reaches_the_best_overload_where_squared_deviation_stops() -> None:
    packing = _packed(TWO_WINDOWS, 3)
    refine_windows(packing)
    before = overload(packing)[0]
    assert before == pytest.approx(8.0)  # squared deviation's local search stops here
    assert refine_overload(packing) > 0
    assert overload(packing)[0] == pytest.approx(_best_overload(TWO_WINDOWS[0], 3)) == pytest.approx(3.0)


def test_alternating_hot_experts_share_a_rank() -> None:
    # Expert 0 is hot in window A (6, cold 1 in B), expert 1 the other way round: together they
    # carry 7 in both windows, next to a mean of 6; any other companion of expert 0 gives its
    # rank at least 8 in window A (overload 4), so sharing a rank is the one best placement.
    a = np.array([6.0, 1, 2, 2, 3, 3, 4, 3])
    b = np.array([1.0, 6, 2, 2, 3, 3, 4, 3])
    weights = np.stack([a, b], axis=1)[None] / 6.0
    packing = _packed(weights, 4)
    refine_windows(packing)
    refine_overload(packing)
    assert overload(packing)[0] == pytest.approx(_best_overload(weights[0], 4))
    ranks = packing.item_bin[0]
    assert ranks[0] == ranks[1]


@pytest.mark.parametrize("seed", range(6))
def test_the_pass_never_adds_overload_nor_copies(seed: int) -> None:
    rng = np.random.default_rng(seed)
    loads = rng.pareto(1.1, (5, 3, 24)) + 0.05  # windows x rows x experts
    shares = window_shares(loads)
    counts = window_counts(shares, 32, 8)
    experts, weights = replica_vectors(shares, counts, 8)
    packing = vector_lpt(experts, weights, 8, 24)
    refine_windows(packing)
    before = overload(packing)
    refine_overload(packing)
    assert (overload(packing) <= before + 1e-12).all()
    assert (packing.has_expert <= 1).all()  # at most one copy of an expert per rank, as before
    assert np.allclose(packing.rank_load, np.take_along_axis(
        packing.weights[:, :, None, :], packing.bin_items.reshape(3, -1)[:, :, None, None], axis=1
    ).reshape(3, 8, 4, 5).sum(axis=2))
    assert sorted(packing.bin_items.ravel().tolist()) == sorted(np.tile(np.arange(32), 3).tolist())


def test_swaps_never_pile_copies_of_an_expert_on_a_rank() -> None:
    # The swap passes score in float32 and check copies only where that score improves; the exact
    # change of a swap they did not check can still improve, and it must not put two copies on a rank.
    from controller.rebalance.history import plan_over_windows
    from tests.controller.rebalance.test_planner import copies_per_rank

    first = np.r_[[1000.0], np.ones(11)][None].repeat(2, 0)  # 12 experts in 6 ranks of 9 slots
    for seed in range(64):
        second = first * np.random.default_rng(seed).uniform(0.2, 2, first.shape)
        plan = plan_over_windows([first, second], num_ranks=6, slots_per_rank=9)
        assert (copies_per_rank(plan.placement) == 1).all(), seed


@pytest.mark.parametrize("seed", range(4))
def test_plans_over_windows_put_at_most_one_copy_of_an_expert_on_a_rank(seed: int) -> None:
    # 10 experts in 3 ranks of 7 slots: packing fills some rank's last free slots with a second
    # copy of an expert, which only spreading the copies afterwards takes off again.
    from controller.rebalance.robust import solve_rows_windows

    loads = np.random.default_rng(seed).pareto(1.0, (3, 400, 10)) * 10  # windows x rows x experts
    phy2log, counts = solve_rows_windows(window_shares(loads), 3, 21)
    per_rank = phy2log.reshape(400, 3, 7)
    copies = (per_rank[:, :, :, None] == np.arange(10)).sum(axis=2)  # (rows, ranks, experts)
    assert (copies <= 1).all()
    assert (copies.sum(axis=1) == counts).all()
