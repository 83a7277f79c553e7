"""Imbalance math: CV, balancedness and max/mean per layer."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.imbalance import balancedness, imbalance_cv, max_over_mean


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
