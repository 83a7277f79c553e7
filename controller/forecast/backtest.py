"""Rolling-origin backtests: how each model would have done, forecasting from every bin in turn.

The backtest runs a model exactly as the controller does: fit at the first
origin and then every ``refit_every`` bins on the last ``history_bins`` values,
``update`` with each new value in between, and forecast ``max(horizons)`` bins
from every origin.  Scores are WAPE (sum of absolute errors over sum of actuals)
per horizon; residuals per horizon give empirical prediction intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from controller.forecast.models import (
    ARIMA_MIN_FIT_BINS,
    HOLT_MIN_FIT_BINS,
    Arima,
    DampedHolt,
    FloatArray,
    ForecastModel,
    LastValue,
    MovingAverage,
    SeasonalNaive,
)

ModelFactory = Callable[[], ForecastModel]

BASELINES = ("last_value", "moving_average", "seasonal_naive")
"""Model kinds that are baselines (what the goal's ratios compare against)."""
MODEL_KINDS = (*BASELINES, "holt_damped", "arima")
MIN_FIT_BINS = {"holt_damped": HOLT_MIN_FIT_BINS, "arima": ARIMA_MIN_FIT_BINS}
"""Fewest bins a model kind estimates its parameters from: a backtest scores it only where its first fit has
that many (a selection, ``moeslo forecast backtest``).  While a forecaster's history was short (under ~256 bins
at a 2-minute horizon of 15 s bins) its selection's first fit took 9 bins, and Holt and ARIMA were scored
unfitted (ARIMA as a random walk: last value's forecasts), so the model deployed, fitted on the whole history,
was not the one scored; and once excluded, they were not candidates at all in that hour.  The selection now
moves its first origin to give the first fit their bins where enough origins remain (``AutoForecaster``)."""


def wape(actual: FloatArray, predicted: FloatArray) -> float:
    """Weighted absolute percentage error: sum |actual - predicted| / sum |actual| (nan if all zero)."""
    denominator = float(np.abs(actual).sum())
    if denominator == 0:
        return float("nan")
    return float(np.abs(actual - predicted).sum() / denominator)


def model_factory(
    kind: str,
    *,
    period: int | None,
    fit_window: int = 720,
    ma_window: int = 8,
    smooth_bins: int | None = None,
) -> ModelFactory:
    """A factory for one model kind (``MODEL_KINDS``); ``period`` is the season in bins, if any."""
    smooth = smooth_bins if smooth_bins is not None else max(1, (period or 0) // 96)
    if kind == "last_value":
        return LastValue
    if kind == "moving_average":
        return lambda: MovingAverage(ma_window)
    if kind == "seasonal_naive":
        if period is None:
            raise ValueError("seasonal_naive needs a period")
        season = period
        return lambda: SeasonalNaive(season)
    if kind == "holt_damped":
        return lambda: DampedHolt(period=period, fit_window=fit_window, smooth_bins=smooth)
    if kind == "arima":
        return lambda: Arima(period=period, fit_window=fit_window, smooth_bins=smooth)
    raise ValueError(f"unknown model kind {kind!r}; choose from {', '.join(MODEL_KINDS)}")


@dataclass(frozen=True, kw_only=True)
class BacktestResult:
    """One model's rolling-origin record."""

    kind: str
    name: str
    horizons: tuple[int, ...]
    wape_by_horizon: dict[int, float]
    residuals: dict[int, FloatArray] = field(repr=False)
    """actual - predicted, per horizon (steps), one per origin."""
    predictions: dict[int, FloatArray] = field(repr=False)
    """Point forecasts per horizon, aligned with ``origins``."""
    origins: np.ndarray = field(repr=False)
    fit_seconds: float = 0.0

    @property
    def mean_wape(self) -> float:
        """WAPE averaged over the horizons where it is defined (nan where the actuals are all zero)."""
        scores = np.array([self.wape_by_horizon[h] for h in self.horizons])
        defined = scores[~np.isnan(scores)]
        return float(defined.mean()) if len(defined) else float("nan")

    def mean_absolute_error(self, horizon: int | None = None) -> float:
        """Mean absolute error at ``horizon`` (or averaged over all horizons)."""
        horizons = self.horizons if horizon is None else (horizon,)
        return float(np.mean([np.mean(np.abs(self.residuals[h])) for h in horizons]))


def rolling_backtest(
    series: FloatArray,
    factory: ModelFactory,
    *,
    kind: str,
    horizons: Sequence[int],
    start: int,
    refit_every: int,
    history_bins: int,
    stride: int = 1,
) -> BacktestResult:
    """Forecast from every ``stride``-th origin in ``[start, len - max(horizons)]``."""
    import time

    if start < 1:
        raise ValueError("start must leave at least one bin of history")
    max_h = max(horizons)
    last_origin = len(series) - max_h
    if last_origin < start:
        raise ValueError(f"series of {len(series)} bins is too short for origin {start} and horizon {max_h}")
    origins = np.arange(start, last_origin + 1, stride)
    predictions = {h: np.empty(len(origins)) for h in horizons}
    model = factory()
    fed = start
    fit_seconds = 0.0
    last_fit: int | None = None
    for i, origin in enumerate(origins):
        t = int(origin)
        if last_fit is None or t - last_fit >= refit_every:
            began = time.perf_counter()
            model.fit(series[max(0, t - history_bins) : t])
            fit_seconds += time.perf_counter() - began
            last_fit = t
        else:
            for j in range(fed, t):
                model.update(float(series[j]))
        fed = t
        path = model.forecast(max_h)
        for h in horizons:
            predictions[h][i] = path[h - 1]
    residuals: dict[int, FloatArray] = {}
    scores: dict[int, float] = {}
    for h in horizons:
        actual = series[origins + h - 1]
        residuals[h] = actual - predictions[h]
        scores[h] = wape(actual, predictions[h])
    return BacktestResult(
        kind=kind,
        name=model.name,
        horizons=tuple(horizons),
        wape_by_horizon=scores,
        residuals=residuals,
        predictions=predictions,
        origins=origins,
        fit_seconds=fit_seconds,
    )


def compare_models(
    series: FloatArray,
    kinds: Sequence[str],
    *,
    period: int | None,
    horizons: Sequence[int],
    start: int,
    refit_every: int,
    history_bins: int,
    fit_window: int = 720,
    ma_window: int = 8,
    stride: int = 1,
    on_model_done: Callable[[BacktestResult], None] | None = None,
) -> list[BacktestResult]:
    """Backtest several model kinds over the same origins (seasonal ones only when a period is given)."""
    results = []
    for kind in kinds:
        if kind == "seasonal_naive" and (period is None or start < period):
            continue
        factory = model_factory(kind, period=period, fit_window=fit_window, ma_window=ma_window)
        result = rolling_backtest(
            series,
            factory,
            kind=kind,
            horizons=horizons,
            start=start,
            refit_every=refit_every,
            history_bins=history_bins,
            stride=stride,
        )
        results.append(result)
        if on_model_done is not None:
            on_model_done(result)
    return results


def is_seasonal(result: BacktestResult) -> bool:
    """Whether the result's model forecast from the season (seasonal naive, or a model on the profile)."""
    return result.kind == "seasonal_naive" or result.name.endswith("_seasonal")


def best(results: Sequence[BacktestResult], *, horizon: int | None = None) -> BacktestResult:
    """The result with the lowest WAPE at ``horizon`` (or averaged over all horizons).

    Where the actuals are all zero (an idle night) WAPE is undefined for every candidate: they are ranked by
    mean absolute error instead, which orders candidates scored on the same actuals as WAPE does.  Exact ties
    go to a seasonal model: on a window of zeros last value, moving average and seasonal naive all score 0,
    and only the seasonal one sees the morning coming.
    """
    scores = [result.mean_wape if horizon is None else result.wape_by_horizon[horizon] for result in results]
    if all(np.isnan(score) for score in scores):
        scores = [result.mean_absolute_error(horizon) for result in results]
    ranked = [
        (float("inf") if np.isnan(score) else score, not is_seasonal(result), index)
        for index, (score, result) in enumerate(zip(scores, results, strict=True))
    ]
    return results[min(ranked)[2]]
