"""A warm-started forecaster's quick fit (a moving average, no selection) forecasts with an interval at once,
and leaves the full refit due."""

from __future__ import annotations

import numpy as np

from controller.forecast import AutoForecaster, ForecastConfig

CONFIG = ForecastConfig(bin_s=15, horizon_s=120, season_s=None, candidates=("last_value", "holt_damped"))


def _seeded(values: np.ndarray) -> AutoForecaster:
    forecaster = AutoForecaster(CONFIG, auto_refit=False)
    for value in values:
        forecaster.observe(float(value))
    forecaster.quick_fit()
    return forecaster


def test_the_quick_fit_forecasts_with_an_interval_and_the_full_refit_stays_due() -> None:
    rng = np.random.default_rng(3)
    forecaster = _seeded(100 + rng.normal(0, 10, size=2000))
    forecast = forecaster.forecast(quantile=0.9)
    assert forecast is not None and forecast.model.startswith("moving_average")
    widths = forecast.upper - forecast.point
    # A noisy series (sd 10) sized at its point forecast was sized ~13 under its 90th percentile.
    assert float(widths.min()) > 5 and float(widths.max()) < 40
    assert forecaster.refit_due and forecaster.fits == 0
    forecaster.refit()
    assert forecaster.fits == 1 and not forecaster.refit_due


def test_a_history_too_short_for_a_backtest_still_forecasts_at_its_point() -> None:
    rng = np.random.default_rng(4)
    forecaster = _seeded(50 + rng.normal(0, 10, size=CONFIG.min_history_bins + 1))  # noisy: a backtest would widen
    forecast = forecaster.forecast()
    assert forecast is not None and float(np.abs(forecast.upper - forecast.point).max()) == 0.0
    longer = _seeded(50 + rng.normal(0, 10, size=CONFIG.min_history_bins + 40))
    wider = longer.forecast()
    assert wider is not None and float((wider.upper - wider.point).max()) > 0  # long enough for one
