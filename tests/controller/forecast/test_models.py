"""Forecast models on synthetic series with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from controller.forecast import (
    Arima,
    AutoForecaster,
    DampedHolt,
    ForecastConfig,
    LastValue,
    MovingAverage,
    RingSeries,
    SeasonalNaive,
    SeasonalProfile,
    rolling_backtest,
    wape,
)
from controller.forecast.auto import MIN_INTERVAL_RESIDUALS
from controller.forecast.models import MA_ROOT_LIMIT, _inside_unit_circle

PERIOD = 48


def seasonal_series(n: int, *, noise: float, seed: int = 0) -> np.ndarray:
    t = np.arange(n)
    rng = np.random.default_rng(seed)
    return 100.0 + 40.0 * np.sin(2 * np.pi * t / PERIOD) + rng.normal(0, noise, n)


def test_wape_known_answer() -> None:
    assert wape(np.array([10.0, 10.0]), np.array([9.0, 12.0])) == pytest.approx(0.15)
    assert np.isnan(wape(np.zeros(3), np.ones(3)))


def test_ring_series_stays_bounded_and_ordered() -> None:
    ring = RingSeries(60.0, keep_s=600.0)
    assert ring.capacity == 10
    ring.extend(np.arange(25, dtype=np.float64))
    assert len(ring) == 10 and ring.total_appended == 25
    assert ring.values().tolist() == list(range(15, 25))
    assert ring.values(3).tolist() == [22, 23, 24]
    assert ring.last() == 24.0


def test_two_weeks_at_one_minute_fit_in_the_default_history() -> None:
    assert AutoForecaster(ForecastConfig(bin_s=60.0)).history.capacity >= 14 * 24 * 60


def test_baselines() -> None:
    history = np.arange(10, dtype=np.float64)
    last = LastValue()
    last.fit(history)
    assert last.forecast(2).tolist() == [9.0, 9.0]
    average = MovingAverage(4)
    average.fit(history)
    average.update(10.0)
    assert average.forecast(1)[0] == pytest.approx(8.5)
    naive = SeasonalNaive(PERIOD)
    series = seasonal_series(3 * PERIOD, noise=0.0)
    naive.fit(series)
    np.testing.assert_allclose(naive.forecast(PERIOD), series[-PERIOD:])


def test_seasonal_profile_recovers_the_shape() -> None:
    series = seasonal_series(4 * PERIOD, noise=0.0)
    profile = SeasonalProfile(PERIOD, series, smooth_bins=1)
    np.testing.assert_allclose(profile.window(0, PERIOD) * 100.0, series[:PERIOD], rtol=1e-9)
    with pytest.raises(ValueError, match="two seasons"):
        SeasonalProfile(PERIOD, series[: PERIOD + 5], smooth_bins=1)


def test_seasonal_holt_forecasts_a_season_within_five_percent() -> None:
    series = seasonal_series(6 * PERIOD, noise=2.0)
    model = DampedHolt(period=PERIOD, fit_window=4 * PERIOD)
    model.fit(series[: 5 * PERIOD])
    assert model.name == "holt_damped_seasonal"
    truth = 100.0 + 40.0 * np.sin(2 * np.pi * np.arange(5 * PERIOD, 6 * PERIOD) / PERIOD)
    assert wape(truth, model.forecast(PERIOD)) < 0.05
    # Without two seasons of history it stays non-seasonal and cannot follow the cycle as well.
    short = DampedHolt(period=PERIOD)
    short.fit(series[: PERIOD + 10])
    assert short.name == "holt_damped"


def test_a_step_change_is_followed() -> None:
    series = np.r_[np.full(120, 100.0), np.full(30, 200.0)] + np.random.default_rng(1).normal(0, 2, 150)
    for model in (DampedHolt(), Arima()):
        model.fit(series[:100])
        for value in series[100:]:
            model.update(float(value))
        forecast = model.forecast(4)
        assert np.all(np.abs(forecast - 200.0) < 20.0), (model.name, forecast)


def test_arima_recursion_matches_a_known_ar_process() -> None:
    rng = np.random.default_rng(2)
    diffs = np.zeros(600)
    for t in range(1, 600):
        diffs[t] = 0.6 * diffs[t - 1] + rng.normal()
    series = 1000.0 + np.cumsum(diffs)
    model = Arima(order=(1, 0), fit_window=600)
    model.fit(series)
    assert model.ar[0] == pytest.approx(0.6, abs=0.1)
    last_diff = series[-1] - series[-2]
    expected = series[-1] + model.ar[0] * last_diff
    assert model.forecast(1)[0] == pytest.approx(expected)


def test_rolling_backtest_of_last_value_on_a_ramp() -> None:
    series = np.arange(1.0, 101.0)
    result = rolling_backtest(
        series, LastValue, kind="last_value", horizons=[1, 3], start=50, refit_every=10, history_bins=50
    )
    # From origin t the last value is series[t-1]; the actual h bins ahead is series[t+h-1]: error h.
    np.testing.assert_allclose(result.residuals[3], 3.0)
    assert result.wape_by_horizon[1] == pytest.approx(len(result.origins) / series[result.origins].sum())


def test_auto_forecaster_picks_seasonal_and_its_interval_covers() -> None:
    config = ForecastConfig(
        bin_s=1800.0,
        horizon_s=4 * 1800.0,
        season_s=PERIOD * 1800.0,
        keep_s=14 * 86400.0,
        refit_every_bins=1000,
        selection_bins=60,
        fit_window_bins=3 * PERIOD,
    )
    forecaster = AutoForecaster(config)
    series = seasonal_series(5 * PERIOD, noise=3.0, seed=5)
    for value in series[: 4 * PERIOD]:
        forecaster.observe(float(value))
    forecaster.refit()
    assert forecaster.model_name in {"holt_damped_seasonal", "arima_211_seasonal", "seasonal_naive"}
    inside = 0
    for t in range(4 * PERIOD, 5 * PERIOD - 4):
        forecast = forecaster.forecast(quantile=0.9)
        assert forecast is not None
        inside += int(forecast.lower[3] <= series[t + 3] <= forecast.upper[3])
        forecaster.observe(float(series[t]))
    coverage = inside / (PERIOD - 4)
    assert 0.6 <= coverage <= 1.0


def test_auto_forecaster_needs_history_first() -> None:
    forecaster = AutoForecaster(ForecastConfig(min_history_bins=16))
    for value in range(5):
        forecaster.observe(float(value))
    assert forecaster.forecast() is None
    with pytest.raises(ValueError, match="quantile"):
        for value in range(20):
            forecaster.observe(float(value))
        forecaster.forecast(quantile=1.5)


def test_an_interval_as_soon_as_the_history_allows_one_from_enough_residuals() -> None:
    """A young forecaster has no error distribution: it refits the first bin that gives each horizon
    MIN_INTERVAL_RESIDUALS backtest residuals (not when its history next doubles), and no earlier refit
    gives it an interval from fewer (four gave intervals that missed most actuals)."""
    config = ForecastConfig(bin_s=2.0, horizon_s=20.0, min_history_bins=8, refit_every_bins=240, season_s=None)
    forecaster = AutoForecaster(config)
    rng = np.random.default_rng(3)
    first_interval = None
    for n in range(1, 60):
        forecaster.observe(float(rng.poisson(10)) / 10.0)
        forecast = forecaster.forecast(quantile=0.9)
        has_interval = forecast is not None and float(forecast.upper.max()) > float(forecast.point.max())
        if first_interval is None and has_interval:
            first_interval = n
            assert forecaster.fits >= 3  # selections from 4..19 origins came first, without an interval
    # 10 bins of horizon + half the minimum history + 20 origins: 34 bins (the doubling schedule: 62).
    assert MIN_INTERVAL_RESIDUALS == 20
    assert first_interval == 34


def test_skipped_bins_take_the_last_value_and_a_gap_past_a_season_restarts() -> None:
    config = ForecastConfig(bin_s=60.0, season_s=3600.0, keep_s=4 * 3600.0, min_history_bins=4)
    forecaster = AutoForecaster(config)
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        forecaster.observe(value)
    assert forecaster.skip(3) is False
    forecaster.observe(9.0)
    np.testing.assert_array_equal(forecaster.history.values(), [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0, 9.0])
    assert config.max_fill_bins == 60
    assert forecaster.skip(61) is True
    assert len(forecaster.history) == 0 and forecaster.forecast() is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arima_takes_the_estimates_statsmodels_arima_fit_gives(seed: int) -> None:
    """Hannan-Rissanen called directly on the differences: the coefficients ``ARIMA(...).fit`` gives."""
    import warnings

    from statsmodels.tsa.arima.model import ARIMA

    rng = np.random.default_rng(seed)
    series = 30 + np.cumsum(rng.normal(size=400)) * 0.3 + rng.poisson(20, 400) / 10
    model = Arima(fit_window=720)
    model.fit(series)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ARIMA(series, order=(model.p, 1, model.q), enforce_stationarity=False,
                       enforce_invertibility=False).fit(method="hannan_rissanen")  # fmt: skip
    params = dict(zip(result.model.param_names, np.asarray(result.params), strict=True))
    reference = Arima(fit_window=720)
    reference.ar = _inside_unit_circle(np.array([params[f"ar.L{i + 1}"] for i in range(model.p)]), -1)
    reference.ma = _inside_unit_circle(np.array([params[f"ma.L{i + 1}"] for i in range(model.q)]), 1, MA_ROOT_LIMIT)
    np.testing.assert_allclose(model.ar, reference.ar, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.ma, reference.ma, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("bin_s", "horizon_s", "bins"), [(15.0, 60.0, 4), (50.0, 120.0, 3), (45.0, 100.0, 3),
                                                           (90.0, 120.0, 2), (0.1, 0.3, 3), (60.0, 60.0, 1)])
def test_the_forecast_covers_the_whole_horizon(bin_s: float, horizon_s: float, bins: int) -> None:
    assert ForecastConfig(bin_s=bin_s, horizon_s=horizon_s).horizon_bins == bins
