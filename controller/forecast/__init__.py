"""Forecasting of request rate and token rates: models, rolling-origin backtests, auto-selection."""

from __future__ import annotations

from controller.forecast.auto import AutoForecaster, Forecast, ForecastConfig
from controller.forecast.backtest import (
    BASELINES,
    MODEL_KINDS,
    BacktestResult,
    best,
    compare_models,
    model_factory,
    rolling_backtest,
    wape,
)
from controller.forecast.history import RingSeries
from controller.forecast.models import (
    Arima,
    DampedHolt,
    ForecastModel,
    LastValue,
    MovingAverage,
    SeasonalNaive,
    SeasonalProfile,
)

__all__ = [
    "BASELINES",
    "MODEL_KINDS",
    "Arima",
    "AutoForecaster",
    "BacktestResult",
    "DampedHolt",
    "Forecast",
    "ForecastConfig",
    "ForecastModel",
    "LastValue",
    "MovingAverage",
    "RingSeries",
    "SeasonalNaive",
    "SeasonalProfile",
    "best",
    "compare_models",
    "model_factory",
    "rolling_backtest",
    "wape",
]
