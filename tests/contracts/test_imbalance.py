"""Imbalance math: CV, balancedness and max/mean per layer."""

from __future__ import annotations

import numpy as np

from contracts.imbalance import balancedness, imbalance_cv, max_over_mean


def test_imbalance_measures_per_layer() -> None:
    load = np.array([[10, 10, 10, 10], [40, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(imbalance_cv(load), [0.0, np.sqrt(3.0), 0.0])
    np.testing.assert_allclose(balancedness(load), [1.0, 0.25, 1.0])
    np.testing.assert_allclose(max_over_mean(load), [1.0, 4.0, 1.0])
