"""Imbalance math: CV, balancedness and max/mean per layer."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import PlacementError
from contracts.imbalance import balancedness, count_replicas, imbalance_cv, max_over_mean


def test_imbalance_measures_per_layer() -> None:
    load = np.array([[10, 10, 10, 10], [40, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(imbalance_cv(load), [0.0, np.sqrt(3.0), 0.0])
    np.testing.assert_allclose(balancedness(load), [1.0, 0.25, 1.0])
    np.testing.assert_allclose(max_over_mean(load), [1.0, 4.0, 1.0])


def test_the_sampling_noise_floor_matches_multinomial_routing() -> None:
    """E[CV^2] over windows of N assignments is CV(p)^2 + R(1 - sum p^2)/N (checked by simulation)."""
    from contracts.imbalance import denoised_cv, imbalance_cv, sampling_noise_cv

    rng = np.random.default_rng(0)
    for shares, n in (([0.25] * 4, 400), ([0.4, 0.2, 0.2, 0.2], 1000)):
        p = np.asarray(shares)
        cv2 = np.mean([imbalance_cv(rng.multinomial(n, p)) ** 2 for _ in range(20_000)])
        noise = float(sampling_noise_cv(n, 4, p))
        assert cv2 == pytest.approx(float(imbalance_cv(p)) ** 2 + noise**2, rel=0.02)
    assert float(sampling_noise_cv(300, 2)) == pytest.approx((1 / 300) ** 0.5)
    assert float(sampling_noise_cv(0, 2)) == float("inf")
    assert denoised_cv([0.5, 0.1], [0.3, 0.2]).tolist() == pytest.approx([0.4, 0.0])


def test_rank_dispersion_is_one_for_independent_draws_and_the_clump_size_for_clumped_ones() -> None:
    """Windows of multinomial routing: about 1 (floored there); every draw counted k times: about k.
    A clumped window's CV spreads k times the variance the independent-draw floor gives it."""
    from contracts.imbalance import imbalance_cv, rank_dispersion, rank_load, sampling_noise_cv

    rng = np.random.default_rng(7)
    layers, experts, ranks = 4, 16, 2
    phy2log = np.tile(np.arange(experts), (layers, 1))
    p = rng.dirichlet(np.ones(experts), size=layers)

    def window(draws: int, clump: int) -> np.ndarray:
        return np.stack([clump * rng.multinomial(draws, row) for row in p]).astype(float)

    independent = [rank_dispersion(np.stack([window(2000, 1) for _ in range(6)]), phy2log, ranks) for _ in range(20)]
    assert np.median(independent) == pytest.approx(1.0, abs=0.15)
    clumped = [rank_dispersion(np.stack([window(250, 8) for _ in range(6)]), phy2log, ranks) for _ in range(20)]
    assert np.median(clumped) == pytest.approx(8.0, rel=0.25)
    # What the factor is for: the measured CV of a clumped window spreads sqrt(k) times as wide as an
    # independent window's of as many assignments, which the floor (counting assignments) cannot see.
    def spread(draws: int, clump: int) -> np.ndarray:
        cvs = [imbalance_cv(rank_load(phy2log, window(draws, clump), ranks)) for _ in range(400)]
        return np.std(cvs, axis=0)

    assert float(np.mean(spread(250, 8) / spread(2000, 1))) == pytest.approx(np.sqrt(8.0), rel=0.2)
    floor = sampling_noise_cv(np.full(layers, 2000.0), ranks, rank_load(phy2log, p, ranks))
    assert np.all(floor == sampling_noise_cv(np.full(layers, 250.0 * 8), ranks, rank_load(phy2log, p, ranks)))


def test_rank_dispersion_needs_two_windows_with_load() -> None:
    from contracts.imbalance import rank_dispersion

    phy2log = np.tile(np.arange(4), (1, 1))
    one = np.ones((1, 1, 4))
    assert rank_dispersion(one, phy2log, 2) == 1.0
    assert rank_dispersion(np.zeros((3, 1, 4)), phy2log, 2) == 1.0
    assert rank_dispersion(np.ones((3, 1, 4)), phy2log, 1) == 1.0
    steady = np.array([[[100.0, 0.0, 100.0, 0.0]], [[0.0, 100.0, 100.0, 0.0]], [[100.0, 0.0, 0.0, 100.0]]])
    assert rank_dispersion(steady, phy2log, 2) == 1.0  # experts 0-1 on rank 0, 2-3 on rank 1: even every window
    drifting = np.array([[[200.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 200.0, 0.0]], [[0.0, 100.0, 0.0, 100.0]]])
    assert rank_dispersion(drifting, phy2log, 2) > 100  # the hot expert moves from rank to rank


def test_count_replicas_counts_each_layer_alone_and_refuses_ids_out_of_range() -> None:
    phy2log = np.random.default_rng(0).integers(0, 5, size=(3, 8))
    expected = [np.bincount(row, minlength=5).tolist() for row in phy2log]
    assert count_replicas(phy2log, 5).tolist() == expected
    with pytest.raises(PlacementError, match=r"\[0, 3\)"):
        count_replicas(np.array([[0, 3], [1, 2]]), 3)  # the 3 would have been counted as layer 1's expert 0
    with pytest.raises(PlacementError):
        count_replicas(np.array([[0, 1], [-1, 2]]), 3)


def test_pooled_dispersion_tests_each_group_within_itself() -> None:
    """Two engines' windows, steady within each but with other hot experts: their difference is not noise."""
    from contracts.imbalance import pooled_rank_dispersion, rank_dispersion

    phy2log = np.array([[0, 1, 2, 3]])
    first = np.array([[[400, 300, 20, 20]]] * 3, dtype=np.float64)
    second = np.array([[[20, 20, 400, 300]]] * 3, dtype=np.float64)
    assert rank_dispersion(np.concatenate([first, second]), phy2log, 2) > 100
    assert pooled_rank_dispersion([first, second], phy2log, 2) == 1.0
    assert pooled_rank_dispersion([[], first], phy2log, 2) == rank_dispersion(first, phy2log, 2)
