"""Model selection on a window of zeros (an idle night): WAPE is undefined there, so the candidates are ranked by
absolute error, ties go to the season, and the first request of the morning brings a new selection."""

from __future__ import annotations

import numpy as np

from controller.forecast import AutoForecaster, BacktestResult, ForecastConfig, best
from controller.forecast.auto import MIN_FIT_BINS

BIN_S = 60.0
DAY_BINS = 240
"""A short "day" of 4 hours keeps the test fast: busy from bin 120 to 200 (ramps of 20 bins), idle otherwise."""


def business_day(days: int) -> np.ndarray:
    t = np.arange(days * DAY_BINS) % DAY_BINS
    return 10.0 * np.clip((t - 100) / 20, 0, 1) * np.clip((200 - t) / 20, 0, 1)


def result(kind: str, name: str, error: float) -> BacktestResult:
    """A backtest on three zero actuals whose forecasts were all ``error`` too high."""
    residuals = {1: np.full(3, -error)}
    return BacktestResult(kind=kind, name=name, horizons=(1,), wape_by_horizon={1: float("nan")},
                          residuals=residuals, predictions={1: np.full(3, error)}, origins=np.arange(3))  # fmt: skip


def test_on_zero_actuals_the_smaller_absolute_error_wins_whatever_the_order() -> None:
    chosen = best([result("last_value", "last_value", 2.0), result("holt_damped", "holt_damped", 0.5)])
    assert chosen.kind == "holt_damped"


def test_exact_ties_go_to_a_seasonal_model() -> None:
    tied = [result("last_value", "last_value", 0.0), result("moving_average", "moving_average_8", 0.0),
            result("seasonal_naive", "seasonal_naive", 0.0)]  # fmt: skip
    assert best(tied).kind == "seasonal_naive"
    assert best(tied[:2]).kind == "last_value"


def test_the_morning_ramp_is_forecast_from_the_season_after_an_idle_night() -> None:
    """Eight idle-at-night days: the selection made at night sees only zeros.  Ranked by list order, last value
    won it and forecast each step of the ramp only once it had arrived (a lead time late)."""
    config = ForecastConfig(bin_s=BIN_S, horizon_s=5 * BIN_S, season_s=DAY_BINS * BIN_S, keep_s=9 * DAY_BINS * BIN_S,
                            refit_every_bins=DAY_BINS, selection_bins=60)  # fmt: skip
    series = business_day(9)
    forecaster = AutoForecaster(config, refit_phase=150)  # refits at bin 90 of each day: after 60 idle bins
    errors = []
    for k, value in enumerate(series[: 8 * DAY_BINS + 130]):
        forecaster.observe(float(value))
        forecast = forecaster.forecast()
        if k >= 8 * DAY_BINS + 95:  # the end of the night and the ramp
            assert forecast is not None
            errors.append(abs(float(forecast.point[-1]) - series[k + 5]))
    assert max(errors) < 0.5  # last value: 2.5 (five bins of a 0.5-per-bin ramp)


def test_a_selection_made_on_zeros_is_made_again_when_the_series_leaves_zero() -> None:
    config = ForecastConfig(bin_s=BIN_S, horizon_s=5 * BIN_S, season_s=None, refit_every_bins=10_000,
                            selection_bins=60)  # fmt: skip
    forecaster = AutoForecaster(config, auto_refit=False)
    for value in [1.0] * 100 + [0.0] * 100:
        forecaster.observe(value)
    forecaster.refit()
    forecaster.observe(0.0)
    assert not forecaster.refit_due
    forecaster.observe(3.0)
    assert forecaster.refit_due



def test_a_candidate_is_backtested_only_from_a_fit_that_estimates_it() -> None:
    """Under ~256 bins the selection's one backtest fit took the first 9 bins, below Holt's 10 and ARIMA's 30:
    both were scored unfitted (ARIMA as a random walk, the same forecasts as last value), and the model deployed
    was not the one scored.  Each candidate now joins the selection once its first fit has its bins."""
    rng = np.random.default_rng(7)
    forecaster = AutoForecaster(ForecastConfig(bin_s=15.0, horizon_s=120.0))
    level, fits, backtested = 30.0, 0, set()
    for _ in range(400):
        level = 30.0 + 0.8 * (level - 30.0) + rng.normal(0.0, 3.0)  # an AR(1), which ARIMA tells from a walk
        forecaster.observe(level)
        if forecaster.fits > fits and forecaster.last_selection:  # a refit, from a selection
            fits = forecaster.fits
            for r in forecaster.last_selection:
                assert int(r.origins[0]) >= MIN_FIT_BINS.get(r.kind, 1), (r.kind, int(r.origins[0]))
                backtested.add(r.kind)
    assert {"last_value", "moving_average", "holt_damped", "arima"} <= backtested
    wape = {r.kind: r.mean_wape for r in forecaster.last_selection}
    assert wape["arima"] != wape["last_value"]


def test_holt_and_arima_join_the_selection_of_a_young_history() -> None:
    """The selection's first fit took 9 bins until its origins reached 240, an hour of 15 s ticks, so Holt (10
    bins) and ARIMA (30) were never candidates in a controller's first hour, nor in a demo.  They now join once
    the first fit can take their bins with 20 origins left for an interval: at a 2-minute lead time (8 bins),
    37 and 57 bins."""
    rng = np.random.default_rng(3)
    forecaster = AutoForecaster(ForecastConfig(bin_s=15.0, horizon_s=120.0))
    joined: dict[str, int] = {}
    fits = 0
    for n in range(1, 121):
        forecaster.observe(20.0 + 0.5 * n + rng.normal(0.0, 2.0))
        if forecaster.fits > fits:
            fits = forecaster.fits
            for r in forecaster.last_selection:
                assert int(r.origins[0]) >= MIN_FIT_BINS.get(r.kind, 1), (r.kind, int(r.origins[0]))
                joined.setdefault(r.kind, n)
    assert joined.get("holt_damped") == 37 and joined.get("arima") == 57, joined


def test_a_restarted_history_lets_holt_join_again() -> None:
    """A gap longer than the fill restarts the history, and the young history's Holt joins again as soon as it can
    (not at the next doubling, 64 bins)."""
    config = ForecastConfig(bin_s=15.0, horizon_s=120.0, season_s=None, fit_window_bins=40)
    forecaster = AutoForecaster(config)
    rng = np.random.default_rng(5)
    for n in range(60):
        forecaster.observe(20.0 + 0.5 * n + rng.normal(0.0, 2.0))
    assert "holt_damped" in {r.kind for r in forecaster.last_selection}
    assert forecaster.skip(config.max_fill_bins + 1)  # restarted
    for _ in range(36):
        forecaster.observe(20.0 + rng.normal(0.0, 2.0))
    assert "holt_damped" not in {r.kind for r in forecaster.last_selection}
    forecaster.observe(20.0)  # the 37th bin: Holt's fit has its 10 bins with 20 origins after them
    assert "holt_damped" in {r.kind for r in forecaster.last_selection}
