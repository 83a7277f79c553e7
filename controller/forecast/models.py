"""Forecast models of one binned series, all behind one small protocol.

Each model is fitted now and then (``fit``: statsmodels estimates the
parameters, which is the expensive part), then fed one value per bin
(``update``: O(1)) and asked for forecasts (``forecast``: O(steps)).  That split
is what lets the controller refit every N ticks and predict cheaply in between.

Models:

- baselines: :class:`LastValue`, :class:`MovingAverage`, :class:`SeasonalNaive`
  (the same time one season, e.g. one day, earlier);
- :class:`DampedHolt`: Holt's linear method with a damped trend (ETS(A,Ad,N));
- :class:`Arima`: ARIMA(p,1,q), estimated by statsmodels' Hannan-Rissanen, forecast by our
  own recursion from the fitted coefficients.

Seasonality: once the history covers two seasons, ``DampedHolt`` and ``Arima`` work
on the series divided by a smoothed multiplicative seasonal profile (the mean of the
past seasons, phase by phase) and multiply it back in their forecasts -- the
"decompose, forecast, recompose" scheme of STL-ETS/STL-ARIMA, which stays cheap
for seasons of thousands of bins (a day at 30 s bins is 2,880), where statsmodels'
own seasonal ETS/SARIMAX would fit thousands of seasonal states.
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MIN_ALPHA = 0.1
"""Smallest level-smoothing weight of :class:`DampedHolt`."""
MA_ROOT_LIMIT = 0.9
"""Largest inverse MA root of :class:`Arima`: an MA(1) of -0.9 still adapts like an EWMA of 0.1."""
HOLT_MIN_FIT_BINS = 10
"""Fewest bins :class:`DampedHolt` estimates its parameters from (below, it keeps its defaults)."""
ARIMA_MIN_FIT_BINS = 30
"""Fewest bins :class:`Arima` estimates its coefficients from (below, it forecasts as a random walk)."""


class ForecastModel(Protocol):
    """A model of one series: fit occasionally, update per bin, forecast cheaply."""

    @property
    def name(self) -> str: ...

    def fit(self, history: FloatArray) -> None:
        """Estimate parameters and state from ``history`` (oldest first)."""
        ...

    def update(self, value: float) -> None:
        """Take the next bin's value (after ``fit``)."""
        ...

    def forecast(self, steps: int) -> FloatArray:
        """Point forecasts for the next ``steps`` bins."""
        ...


class LastValue:
    """Tomorrow looks like now."""

    name = "last_value"

    def __init__(self) -> None:
        self._last = 0.0

    def fit(self, history: FloatArray) -> None:
        self._last = float(history[-1]) if len(history) else 0.0

    def update(self, value: float) -> None:
        self._last = value

    def forecast(self, steps: int) -> FloatArray:
        return np.full(steps, self._last)


class MovingAverage:
    """The mean of the last ``window`` bins."""

    def __init__(self, window: int = 10) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.name = f"moving_average_{window}"
        self._values: deque[float] = deque(maxlen=window)

    def fit(self, history: FloatArray) -> None:
        self._values.clear()
        self._values.extend(float(v) for v in history[-self.window :])

    def update(self, value: float) -> None:
        self._values.append(value)

    def forecast(self, steps: int) -> FloatArray:
        mean = sum(self._values) / len(self._values) if self._values else 0.0
        return np.full(steps, mean)


class SeasonalNaive:
    """The value one season earlier (e.g. the same time yesterday); last value until a season is seen."""

    name = "seasonal_naive"

    def __init__(self, period: int) -> None:
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        self.period = period
        self._values: deque[float] = deque(maxlen=period)

    def fit(self, history: FloatArray) -> None:
        self._values.clear()
        self._values.extend(float(v) for v in history[-self.period :])

    def update(self, value: float) -> None:
        self._values.append(value)

    def forecast(self, steps: int) -> FloatArray:
        values = self._values
        if len(values) < self.period:
            return np.full(steps, values[-1] if values else 0.0)
        # values[0] is one season before the next bin; step h reads values[h] (wrapping after a season).
        return np.array([values[h % self.period] for h in range(steps)], dtype=np.float64)


class SeasonalProfile:
    """Multiplicative seasonal indices (mean 1), phase 0 at the first value of the fitted history."""

    def __init__(self, period: int, history: FloatArray, *, smooth_bins: int, max_seasons: int = 7) -> None:
        n = len(history)
        seasons = min(n // period, max_seasons)
        if seasons < 2:
            raise ValueError(f"a seasonal profile needs two seasons ({2 * period} bins), got {n}")
        start = n - seasons * period
        block = history[start:].reshape(seasons, period)
        # Each season scaled to mean 1 first, so a busy weekday does not outweigh a quiet weekend day.
        means = block.mean(axis=1, keepdims=True)
        shape = (block / np.where(means > 0, means, 1.0)).mean(axis=0)
        if smooth_bins > 1:
            kernel = np.ones(smooth_bins) / smooth_bins
            padded = np.concatenate([shape[-smooth_bins:], shape, shape[:smooth_bins]])
            shape = np.convolve(padded, kernel, mode="same")[smooth_bins:-smooth_bins]
        shape = np.maximum(shape, 1e-3)
        shape /= shape.mean()
        # Rotate so that index 0 is the phase of history[0].
        self.period = period
        self.indices: FloatArray = np.roll(shape, start % period).astype(np.float64)

    def at(self, position: int) -> float:
        return float(self.indices[position % self.period])

    def window(self, start: int, steps: int) -> FloatArray:
        return np.asarray(self.indices[(start + np.arange(steps)) % self.period], dtype=np.float64)


class _Deseasonalized:
    """Shared plumbing: divide by the seasonal profile when history allows, track the position."""

    def __init__(self, *, period: int | None, fit_window: int, smooth_bins: int) -> None:
        self.period = period
        self.fit_window = fit_window
        self.smooth_bins = smooth_bins
        self._profile: SeasonalProfile | None = None
        self._position = 0
        """Index (from the fitted history's start) of the next bin to arrive."""

    @property
    def seasonal(self) -> bool:
        return self._profile is not None

    def _prepare(self, history: FloatArray) -> FloatArray:
        self._profile = None
        if self.period is not None and len(history) >= 2 * self.period:
            self._profile = SeasonalProfile(self.period, history, smooth_bins=self.smooth_bins)
        self._position = len(history)
        adjusted = history if self._profile is None else history / self._profile.window(0, len(history))
        return np.asarray(adjusted[-self.fit_window :], dtype=np.float64)

    def _adjust(self, value: float) -> float:
        adjusted = value if self._profile is None else value / self._profile.at(self._position)
        self._position += 1
        return adjusted

    def _recompose(self, adjusted: FloatArray) -> FloatArray:
        if self._profile is None:
            return np.maximum(adjusted, 0.0)
        return np.maximum(adjusted * self._profile.window(self._position, len(adjusted)), 0.0)


class DampedHolt(_Deseasonalized):
    """ETS(A,Ad,N) -- Holt's method with a damped trend -- on the deseasonalized series."""

    def __init__(self, *, period: int | None = None, fit_window: int = 720, smooth_bins: int = 1) -> None:
        super().__init__(period=period, fit_window=fit_window, smooth_bins=smooth_bins)
        self.alpha = 0.5
        self.beta = 0.0
        self.phi = 0.98
        self._level = 0.0
        self._trend = 0.0

    @property
    def name(self) -> str:
        return "holt_damped_seasonal" if self.seasonal else "holt_damped"

    def fit(self, history: FloatArray) -> None:
        z = self._prepare(history)
        if len(z) >= HOLT_MIN_FIT_BINS and float(np.ptp(z)) > 0:
            from statsmodels.tsa.holtwinters import ExponentialSmoothing

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # SLSQP: the same sum of squared errors as the default L-BFGS-B here, at a tenth of its
                # time (L-BFGS-B spent ~5 ms per iteration inside scipy's setulb on these machines).
                result = ExponentialSmoothing(z, trend="add", damped_trend=True, initialization_method="estimated").fit(
                    use_brute=False, method="SLSQP"
                )
            params = result.params
            # A floor on alpha: fitted on a flat stretch, alpha goes to 0 and the model would
            # never follow a later level shift (0.1 follows a step within ~20 bins).
            self.alpha = max(float(params["smoothing_level"]), MIN_ALPHA)
            self.beta = float(params["smoothing_trend"])
            self.phi = float(params["damping_trend"])
            self._level = float(params["initial_level"])
            self._trend = float(params["initial_trend"])
            for value in z:
                self._step(float(value))
        else:
            self._level = float(z[-1]) if len(z) else 0.0
            self._trend = 0.0

    def _step(self, z: float) -> None:
        previous = self._level
        self._level = self.alpha * z + (1 - self.alpha) * (previous + self.phi * self._trend)
        self._trend = self.beta * (self._level - previous) + (1 - self.beta) * self.phi * self._trend

    def update(self, value: float) -> None:
        self._step(self._adjust(value))

    def forecast(self, steps: int) -> FloatArray:
        damping = np.cumsum(self.phi ** np.arange(1, steps + 1))
        return self._recompose(self._level + damping * self._trend)


class Arima(_Deseasonalized):
    """ARIMA(p,1,q) on the deseasonalized series: statsmodels estimates, our recursion forecasts."""

    def __init__(
        self,
        *,
        order: tuple[int, int] = (2, 1),
        period: int | None = None,
        fit_window: int = 720,
        smooth_bins: int = 1,
    ) -> None:
        super().__init__(period=period, fit_window=fit_window, smooth_bins=smooth_bins)
        self.p, self.q = order
        self.ar = np.zeros(self.p)
        self.ma = np.zeros(self.q)
        self._diffs: deque[float] = deque([0.0] * max(self.p, 1), maxlen=max(self.p, 1))
        self._errors: deque[float] = deque([0.0] * max(self.q, 1), maxlen=max(self.q, 1))
        self._last = 0.0

    @property
    def name(self) -> str:
        return f"arima_{self.p}1{self.q}" + ("_seasonal" if self.seasonal else "")

    def fit(self, history: FloatArray) -> None:
        z = self._prepare(history)
        self.ar = np.zeros(self.p)
        self.ma = np.zeros(self.q)
        if len(z) >= ARIMA_MIN_FIT_BINS and float(np.ptp(z)) > 0:
            from statsmodels.tsa.arima.estimators.hannan_rissanen import hannan_rissanen

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Hannan-Rissanen (regressions, no numerical optimizer): ~100x cheaper than SARIMAX's
                # state-space MLE, close enough for refits every few minutes.  Called directly on the
                # differences: through ``ARIMA(...).fit`` the same estimates cost a state-space
                # smoothing pass too (half of the fit), whose results are never read.
                params, _ = hannan_rissanen(np.diff(z), ar_order=self.p, ma_order=self.q, demean=False)
            self.ar = _inside_unit_circle(np.asarray(params.ar_params, dtype=float).reshape(self.p), -1)
            self.ma = _inside_unit_circle(
                np.asarray(params.ma_params, dtype=float).reshape(self.q), 1, MA_ROOT_LIMIT
            )
        self._diffs = deque([0.0] * max(self.p, 1), maxlen=max(self.p, 1))
        self._errors = deque([0.0] * max(self.q, 1), maxlen=max(self.q, 1))
        self._last = float(z[0]) if len(z) else 0.0
        for value in z[1:]:
            self._step(float(value))

    def _predict_diff(self, diffs: deque[float], errors: deque[float]) -> float:
        total = 0.0
        for i in range(self.p):
            total += self.ar[i] * diffs[-1 - i]
        for j in range(self.q):
            total += self.ma[j] * errors[-1 - j]
        return total

    def _step(self, z: float) -> None:
        diff = z - self._last
        error = diff - self._predict_diff(self._diffs, self._errors)
        self._diffs.append(diff)
        self._errors.append(error)
        self._last = z

    def update(self, value: float) -> None:
        self._step(self._adjust(value))

    def forecast(self, steps: int) -> FloatArray:
        diffs = deque(self._diffs, maxlen=self._diffs.maxlen)
        errors = deque(self._errors, maxlen=self._errors.maxlen)
        level = self._last
        out = np.empty(steps)
        for h in range(steps):
            diff = self._predict_diff(diffs, errors)
            diffs.append(diff)
            errors.append(0.0)
            level += diff
            out[h] = level
        return self._recompose(out)


def _inside_unit_circle(coefficients: FloatArray, sign: int, limit: float = 0.98) -> FloatArray:
    """Shrink lag coefficients so the polynomial ``1 + sign * sum(c_i z^i)`` is stable/invertible.

    Hannan-Rissanen estimates need not be; scaling ``c_i`` by ``rho**i`` divides every inverse
    root by ``rho``, which brings the largest back to ``limit``.
    """
    if len(coefficients) == 0 or not np.all(np.isfinite(coefficients)):
        return np.zeros_like(coefficients)
    polynomial = np.r_[1.0, sign * coefficients]  # lowest power first
    inverse_roots = np.abs(np.roots(polynomial))  # np.roots wants highest power first: reversed = inverse roots
    largest = float(inverse_roots.max()) if len(inverse_roots) else 0.0
    if largest < limit:
        return coefficients
    rho = limit / largest
    return coefficients * rho ** np.arange(1, len(coefficients) + 1)


def preload_fitters() -> None:
    """Import statsmodels' fitters now (about a second), not inside the first tick that refits."""
    import statsmodels.tsa.arima.model
    import statsmodels.tsa.holtwinters  # noqa: F401
