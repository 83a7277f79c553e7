"""A self-selecting forecaster of one series, as the controller runs it tick by tick.

Every ``refit_every_bins`` observations it backtests each candidate on the
recent history (rolling origin), keeps the model with the lowest WAPE over the
forecast horizon, refits it, and takes its backtest residuals per horizon as the
empirical error distribution for prediction intervals.  In between, each new
value is an O(1) ``update`` and forecasts are cheap.

Bins that were never observed (the metrics source was down) are filled with
the last value before them (:meth:`AutoForecaster.skip`), as the warm start
fills what a stopped controller did not see, so a season stays aligned with
the clock; a gap longer than a season (without one, the fit window) restarts
the history instead of making up a day of flat load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from contracts.slo_defaults import LEAD_TIME_S
from controller.forecast.backtest import MIN_FIT_BINS, BacktestResult, best, compare_models, model_factory
from controller.forecast.history import DAY_S, TWO_WEEKS_S, RingSeries, bins_covering
from controller.forecast.models import FloatArray, ForecastModel


@dataclass(frozen=True, kw_only=True, slots=True)
class ForecastConfig:
    bin_s: float = 15.0
    """One observation per bin (the controller's tick)."""
    horizon_s: float = float(LEAD_TIME_S)
    """How far ahead forecasts are needed (the lead time); selection scores this window."""
    keep_s: float = TWO_WEEKS_S
    refit_every_bins: int = 240
    fit_window_bins: int = 720
    selection_bins: int = 240
    """Recent bins the selection backtest forecasts from (its origins)."""
    season_s: float | None = DAY_S
    """Season length; seasonal models switch on once the history covers two of them."""
    min_history_bins: int = 16
    candidates: tuple[str, ...] = ("last_value", "moving_average", "seasonal_naive", "holt_damped", "arima")
    ma_window_bins: int = 8

    def __post_init__(self) -> None:
        problems = []
        if self.bin_s <= 0:
            problems.append(f"bin_s must be > 0, got {self.bin_s}")
        if self.horizon_s < self.bin_s:
            problems.append(f"horizon_s ({self.horizon_s}) must be at least one bin ({self.bin_s})")
        if self.keep_s < 2 * DAY_S and self.season_s == DAY_S:
            problems.append("keep_s must cover two seasons for seasonal models")
        if self.refit_every_bins < 1 or self.selection_bins < 1:
            problems.append("refit_every_bins and selection_bins must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def horizon_bins(self) -> int:
        """Bins that cover the horizon: a lead time the bin does not divide is covered up to its end."""
        return bins_covering(self.horizon_s, self.bin_s)

    @property
    def period_bins(self) -> int | None:
        return None if self.season_s is None else max(1, round(self.season_s / self.bin_s))

    @property
    def max_fill_bins(self) -> int:
        """The longest gap :meth:`AutoForecaster.skip` fills: a season, or the fit window without one."""
        return self.period_bins or self.fit_window_bins


@dataclass(frozen=True, kw_only=True, slots=True)
class Forecast:
    """Forecasts for the next ``len(point)`` bins with a central interval at ``quantile``."""

    model: str
    point: FloatArray
    lower: FloatArray
    upper: FloatArray
    quantile: float
    bin_s: float


MIN_SELECTION_ORIGINS = 4
"""Fewest backtest origins a model selection is made from."""
MIN_INTERVAL_RESIDUALS = 20
"""Fewest backtest residuals per horizon an error distribution (so an interval) is made from: two in each
10 % tail of the audited 80 % interval.  From four, a young forecaster's residuals (all of one sign while the
load rose in its first minutes) gave an interval that missed 75-85 % of the actuals, and the audit then
distrusted the forecast for 20 minutes after a refit had replaced it with a sound one."""

SCALE_FLOOR_SHARE = 0.05
"""Residuals are scaled by sqrt(max(forecast, this share of the mean)): arrival counts are roughly
Poisson, so errors grow with the square root of the level, and an interval learnt at night still
fits the afternoon peak (and a step to a new level)."""


class AutoForecaster:
    """Ring-buffer history, periodic model selection and refit, cheap forecasts in between."""

    def __init__(
        self, config: ForecastConfig | None = None, *, refit_phase: int = 0, auto_refit: bool = True
    ) -> None:
        self.config = config or ForecastConfig()
        self.auto_refit = auto_refit
        """False: the caller refits when :attr:`refit_due` (e.g. within a per-tick budget over many series)."""
        self.refit_phase = refit_phase % self.config.refit_every_bins
        """Offsets the periodic refits (e.g. a hash of the policy name), so that many forecasters
        started together do not all refit in the same tick."""
        self.history = RingSeries(self.config.bin_s, keep_s=self.config.keep_s)
        self._model: ForecastModel | None = None
        self._residuals: dict[int, FloatArray] = {}
        self._offset_cache: dict[tuple[float, int], tuple[FloatArray, FloatArray]] = {}
        self._since_fit = 0
        self._scale_floor = 1e-9
        self.last_selection: list[BacktestResult] = []
        self._selected_on_zeros = False
        """The last selection's window held only zeros (scored by absolute error, ties to the season)."""
        self._candidates_fit = 0
        """Candidates the last refit could backtest (whether or not it had origins enough to select): while the
        history is young, a refit is due as soon as one more can."""
        self.fits = 0

    @property
    def bins_since_fit(self) -> int:
        """Bins observed since the model was fitted or its last refit was tried (without a model, all of them)."""
        return len(self.history) if self._model is None else self._since_fit

    @property
    def model_name(self) -> str | None:
        return None if self._model is None else self._model.name

    def observe(self, value: float) -> None:
        """The next bin's value (call once per bin, in order); refits when due unless ``auto_refit`` is off."""
        if not np.isfinite(value):
            value = self.history.last() if len(self.history) else 0.0
        self._append(value)
        if self.auto_refit and self.refit_due:
            self.refit()

    def _append(self, value: float) -> None:
        self.history.append(value)
        if self._model is not None:
            self._model.update(value)
            self._since_fit += 1

    def skip(self, bins: int) -> bool:
        """``bins`` bins went unobserved: each takes the last value, so the next observation lands in its own
        bin and a season keeps its phase.  A gap longer than :attr:`ForecastConfig.max_fill_bins` is not
        made up: the history restarts (and the forecaster warms up again).  True when it restarted."""
        if bins <= 0 or not len(self.history):
            return False
        if bins > self.config.max_fill_bins:
            self.history = RingSeries(self.config.bin_s, keep_s=self.config.keep_s)
            self._model = None
            self._residuals = {}
            self._offset_cache.clear()
            self._since_fit = 0
            return True
        value = self.history.last()
        for _ in range(bins):
            self._append(value)
        if self.auto_refit and self.refit_due:
            self.refit()
        return False

    def _selection_origins(self, n: int) -> int:
        """Origins the selection backtests from, of ``n`` bins.  Its one backtest fit takes the bins before
        the first origin: at least ``min_history_bins // 2 + 1``, and more where that lets a candidate that
        estimates parameters from more (Holt 10 bins, ARIMA 30) join while the selection keeps enough origins
        for an interval.  Without this, a young history's first fit took 9 bins, below Holt's 10, until the
        origins reached ``selection_bins`` (an hour of 15 s bins): no Holt nor ARIMA in that hour."""
        cfg = self.config
        shortest = cfg.min_history_bins // 2 + 1
        needs = sorted({max(shortest, MIN_FIT_BINS.get(kind, 1)) for kind in cfg.candidates}, reverse=True)
        for need in needs:
            origins = n - cfg.horizon_bins - need + 1
            if origins >= MIN_INTERVAL_RESIDUALS:
                return min(cfg.selection_bins, origins)
        return min(cfg.selection_bins, n - cfg.horizon_bins - shortest + 1)

    @property
    def refit_due(self) -> bool:
        """Whether a refit is due: when the history has doubled since the last fit (early on, every few
        bins count), and every ``refit_every_bins`` once it is long, each at this forecaster's phase;
        and as soon as a model without an error distribution (no interval yet) can be given one, or (while
        the history is young) the selection can backtest one more candidate than it last did."""
        n = len(self.history)
        if n < self.config.min_history_bins:
            return False
        if self._model is None:
            return True
        if not self._residuals and self._selection_origins(n) >= MIN_INTERVAL_RESIDUALS:
            return True
        if self._selected_on_zeros and self.history.last() > 0:
            return True  # the series leaves zero (the morning): choose again on what it does now
        every = self.config.refit_every_bins
        if n < 2 * every:
            origins, _, _, kinds = self._selection_plan(n)
            if origins >= MIN_SELECTION_ORIGINS and len(kinds) > self._candidates_fit:
                return True  # Holt or ARIMA can join the selection now (later, the season waits for the cadence)
            half = max(n // 2, 1)
            return self._since_fit >= half + self.refit_phase % max(half // 4, 1)
        if self._since_fit >= every:
            return True
        return (self.history.total_appended + self.refit_phase) % every == 0 and self._since_fit >= every // 2

    def quick_fit(self) -> None:
        """A moving average over the history, at once and without selection (after a warm start), so
        forecasts are available before the full refit, which stays due.  Its interval comes from its own
        backtest (a moving average's costs ~0.03 ms a bin): without one, the forecasts sized the fleet at their
        point until the full refit, which the refit budget gives one policy a tick."""
        series = self.history.values()
        if len(series) < self.config.min_history_bins or self._model is not None:
            return
        self._model = model_factory("moving_average", period=None, ma_window=self.config.ma_window_bins)()
        self._model.fit(series)
        self._residuals = {}
        origins, start, _, _ = self._selection_plan(len(series))
        if origins >= MIN_SELECTION_ORIGINS:
            backtest = self._backtest(series, ["moving_average"], origins=origins, start=start, period=None)
            self._scale_floor, self._residuals = self._scaled_residuals(series, backtest[0])
        self._offset_cache.clear()
        self._since_fit = max(len(series), self.config.refit_every_bins)

    def _selection_plan(self, n: int) -> tuple[int, int, int | None, list[str]]:
        """(origins, first origin, period, candidates) of a selection over ``n`` bins."""
        cfg = self.config
        period = cfg.period_bins if cfg.period_bins is not None and n >= 2 * cfg.period_bins else None
        origins = self._selection_origins(n)
        start = n - cfg.horizon_bins - origins + 1  # the backtest's first fit takes the bins before it
        kinds = [
            k
            for k in cfg.candidates
            if (k != "seasonal_naive" or period is not None) and start >= MIN_FIT_BINS.get(k, 1)
        ]
        return origins, start, period, kinds

    @property
    def refit_is_cheap(self) -> bool:
        """Whether the next refit fits no model that estimates parameters (only last value, moving average or
        seasonal naive, or no selection at all): about 0.03 ms a bin.  One that fits Holt or ARIMA costs 7-75 ms,
        7 ms at 40 bins (the controller's refit budget counts it as a full refit)."""
        origins, _, _, kinds = self._selection_plan(len(self.history))
        return origins < MIN_SELECTION_ORIGINS or not any(kind in MIN_FIT_BINS for kind in kinds)

    def refit(self) -> None:
        """Select the best candidate on recent history, fit it, and refresh the error distribution.

        All or nothing: a selection or fit that raises leaves the model, its residuals and the selection as they
        were, and the refit waits for the cadence again (a failing fit is not retried every bin)."""
        cfg = self.config
        series = self.history.values()
        origins, start, period, kinds = self._selection_plan(len(series))
        self._since_fit, self._candidates_fit = 0, len(kinds)  # before what may raise: a retry waits its turn
        selection: list[BacktestResult] = []
        residuals: dict[int, FloatArray] = {}
        scale_floor, on_zeros, kind = self._scale_floor, False, "last_value"
        if origins >= MIN_SELECTION_ORIGINS and kinds:
            selection = self._backtest(series, kinds, origins=origins, start=start, period=period)
            chosen = best(selection)
            on_zeros = not np.any(series[start:])
            scale_floor, residuals = self._scaled_residuals(series, chosen)
            kind = chosen.kind
        model = model_factory(kind, period=period, fit_window=cfg.fit_window_bins, ma_window=cfg.ma_window_bins)()
        model.fit(series)
        self._model, self._residuals, self._scale_floor = model, residuals, scale_floor
        self.last_selection = selection or self.last_selection
        self._selected_on_zeros = on_zeros
        self._offset_cache.clear()
        self.fits += 1

    def _backtest(self, series: FloatArray, kinds: list[str], *, origins: int, start: int,
                  period: int | None) -> list[BacktestResult]:  # fmt: skip
        cfg = self.config
        return compare_models(
            series,
            kinds,
            period=period,
            horizons=list(range(1, cfg.horizon_bins + 1)),
            start=start,
            refit_every=origins + 1,
            history_bins=cfg.fit_window_bins if period is None else len(series),
            fit_window=cfg.fit_window_bins,
            ma_window=cfg.ma_window_bins,
        )

    @staticmethod
    def _scaled_residuals(series: FloatArray, chosen: BacktestResult) -> tuple[float, dict[int, FloatArray]]:
        """(the scale floor, each horizon's residuals over the square root of its prediction) of a backtest."""
        scale_floor = max(SCALE_FLOOR_SHARE * float(np.mean(series)), 1e-9)
        return scale_floor, {
            h: r / np.sqrt(np.maximum(chosen.predictions[h], scale_floor))
            for h, r in chosen.residuals.items()
            if len(r) >= MIN_INTERVAL_RESIDUALS
        }

    def _offsets(self, quantile: float, steps: int) -> tuple[FloatArray, FloatArray]:
        """Quantiles of the scaled residuals per horizon (cached until the next refit): (lower <= 0, upper >= 0)."""
        key = (quantile, steps)
        cached = self._offset_cache.get(key)
        if cached is not None:
            return cached
        below = np.zeros(steps)
        above = np.zeros(steps)
        for h in range(1, steps + 1):
            residuals = self._residuals.get(min(h, max(self._residuals, default=h)))
            if residuals is not None:
                above[h - 1] = max(0.0, float(np.quantile(residuals, quantile)))
                below[h - 1] = min(0.0, float(np.quantile(residuals, 1 - quantile)))
        self._offset_cache[key] = (below, above)
        return below, above

    def forecast(self, *, quantile: float = 0.9, steps: int | None = None) -> Forecast | None:
        """Point and interval forecasts, or None before there is enough history."""
        if self._model is None:
            return None
        if not 0.5 <= quantile < 1:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
        n = steps or self.config.horizon_bins
        point = self._model.forecast(n)
        lower, upper = self._interval(point, quantile)
        return Forecast(model=self._model.name, point=point, lower=lower, upper=upper, quantile=quantile,
                        bin_s=self.config.bin_s)

    def at_quantile(self, forecast: Forecast, quantile: float) -> Forecast:
        """``forecast``'s point forecasts with their central interval at ``quantile`` (no second model call)."""
        if not 0.5 <= quantile < 1:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
        lower, upper = self._interval(forecast.point, quantile)
        return replace(forecast, lower=lower, upper=upper, quantile=quantile)

    def _interval(self, point: FloatArray, quantile: float) -> tuple[FloatArray, FloatArray]:
        """(lower >= 0, upper) of the central interval at ``quantile`` around ``point``."""
        below, above = self._offsets(quantile, len(point))
        scale = np.sqrt(np.maximum(point, self._scale_floor))
        return np.maximum(point + below * scale, 0.0), point + above * scale
