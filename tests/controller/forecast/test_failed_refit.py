"""A refit whose fit raises changes nothing: the model, its interval and the selection stay, and it is not
retried every bin."""

from __future__ import annotations

import numpy as np
import pytest

from controller.forecast import AutoForecaster, ForecastConfig
from controller.forecast.models import DampedHolt
from controller.refit_budget import RefitBudget

CONFIG = ForecastConfig(bin_s=15, horizon_s=120, season_s=None, candidates=("last_value", "holt_damped"))


def test_a_fit_that_raises_keeps_the_fitted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    forecaster = AutoForecaster(CONFIG, auto_refit=False)
    for _ in range(1000):
        forecaster.observe(100 + rng.normal(0, 5))
    forecaster.refit()
    before = forecaster.forecast()
    assert before is not None and before.model == "holt_damped"
    fit = DampedHolt.fit

    def failing_on_the_whole_history(self: DampedHolt, history: np.ndarray) -> None:
        if len(history) >= 1000:  # the backtest's shorter fits succeed, the deployed model's fit fails
            raise np.linalg.LinAlgError("SVD did not converge")
        fit(self, history)

    monkeypatch.setattr(DampedHolt, "fit", failing_on_the_whole_history)
    budget, failures = RefitBudget(1, 512), 0
    for k in range(300):
        forecaster.observe(100 + rng.normal(0, 5))
        failures += len(budget.refit_all({"p": forecaster}, k * 15.0))
        after = forecaster.forecast()
        assert after is not None and after.model == "holt_damped"
        assert float(np.abs(after.point - 100).max()) < 10  # a fitted level, not an unfitted model's 0-50
        assert float((after.upper - after.point).min()) > 0  # its interval with it
    assert forecaster.fits == 1
    assert 1 <= failures <= 2  # at the cadence (240 bins), not every bin
