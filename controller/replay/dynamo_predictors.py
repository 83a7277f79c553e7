"""The load predictors of NVIDIA Dynamo's SLA planner, one instance per series (requests, ISL, OSL).

Ported from ai-dynamo/dynamo ``components/src/dynamo/planner/utils/load_predictor.py``
(Gen A, @0ff50012):

- ``BasePredictor.add_data_point``: NaN becomes 0; leading zeros are skipped
  until the first non-zero value;
- ``ConstantPredictor``: the last value;
- ``ARIMAPredictor``: fewer than 5 points, the last value; all points equal, that
  value; on the first call with 5 or more points ``pmdarima.auto_arima`` picks the
  order once (KPSS test for ``d``, stepwise AIC search over ``p`` and ``q``; see
  :func:`select_order`) and it is never re-selected; an order ``(0, d, 0)`` is refitted
  on ``log1p`` of the series and the predictor stays in log space; later calls feed
  the new points to the model (``ARIMA.update``); a one-step forecast, floored at 0;
  any exception gives the last value;
- ``KalmanPredictor`` (filterpy): a local linear trend, ``F = [[1, 1], [0, 1]]``,
  ``H = [1, 0]``, ``P0 = 1000 I``, ``Q = diag(1.0, 0.1)``, ``R = 10``; the first point
  sets the level; the forecast is the predicted level.

pmdarima is not a dependency; :func:`select_order` ports its stepwise search onto
statsmodels' SARIMAX (which pmdarima wraps).  One deviation for speed, stated: pmdarima's
``update`` re-estimates the parameters on the whole history at every new point (five
L-BFGS iterations from the old ones); here the parameters are re-estimated that way
every ``refit_every`` points on the last ``fit_window`` points, and between refits new
points are filtered with fixed parameters (the order, the model family and the
one-step forecast are the same).
"""

from __future__ import annotations

import math
import warnings
from typing import Protocol

import numpy as np

from contracts.errors import ValidationError
from contracts.traces import FloatArray

__all__ = [
    "PREDICTORS",
    "ArimaPredictor",
    "ConstantPredictor",
    "KalmanPredictor",
    "LoadPredictor",
    "make_predictor",
    "select_order",
]

PREDICTORS = ("constant", "arima", "kalman")
MIN_POINTS = 5


class LoadPredictor(Protocol):
    def add_data_point(self, value: float) -> None: ...

    def predict_next(self) -> float: ...


class _Buffer:
    """``BasePredictor``: the data buffer with Dynamo's NaN and leading-zero rules."""

    def __init__(self) -> None:
        self.data: list[float] = []

    def add_data_point(self, value: float) -> None:
        value = 0.0 if math.isnan(value) else float(value)
        if not self.data and value == 0.0:
            return  # leading zeros are skipped
        self.data.append(value)

    def last(self) -> float:
        return self.data[-1] if self.data else 0.0


class ConstantPredictor(_Buffer):
    def predict_next(self) -> float:
        return self.last()


class KalmanPredictor(_Buffer):
    """Local linear trend Kalman filter (filterpy's ``KalmanFilter(dim_x=2, dim_z=1)``)."""

    def __init__(self, *, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0) -> None:
        super().__init__()
        self.f = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.q = np.diag([q_level, q_trend])
        self.r = r
        self.x: FloatArray | None = None
        self.p = np.eye(2) * 1000.0
        self._predicted = False

    def _predict(self) -> None:
        assert self.x is not None
        self.x = self.f @ self.x
        self.p = self.f @ self.p @ self.f.T + self.q
        self._predicted = True

    def add_data_point(self, value: float) -> None:
        before = len(self.data)
        super().add_data_point(value)
        if len(self.data) == before:
            return
        z = self.data[-1]
        if self.x is None:
            self.x = np.array([z, 0.0])
            return
        if not self._predicted:
            self._predict()
        # update(z) with H = [1, 0]
        s = self.p[0, 0] + self.r
        gain = self.p[:, 0] / s
        self.x = self.x + gain * (z - self.x[0])
        self.p = self.p - np.outer(gain, self.p[0, :])
        self._predicted = False

    def predict_next(self) -> float:
        if self.x is None:
            return 0.0
        if not self._predicted:
            self._predict()
        return float(self.x[0])


def _fit(y: FloatArray, order: tuple[int, int, int], *, start: FloatArray | None = None, maxiter: int = 50) -> object:
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    d = order[1]
    trend = "c" if d in (0, 1) else None  # pmdarima: with_intercept="auto" -> intercept iff d < 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SARIMAX(y, order=order, trend=trend)
        return model.fit(start_params=start, method="lbfgs", maxiter=maxiter, disp=False)


def _aic(result: object, order: tuple[int, int, int]) -> float:
    """AIC, or inf when a root lies on or outside the unit circle (pmdarima's ``_is_invertible`` check)."""
    ar = np.asarray(getattr(result, "arroots", []))
    ma = np.asarray(getattr(result, "maroots", []))
    roots = np.r_[ar, ma]
    if len(roots) and np.any(1.0 / np.abs(roots) > 0.99):
        return math.inf
    aic = float(getattr(result, "aic", math.inf))
    return aic if math.isfinite(aic) else math.inf


def ndiffs_kpss(y: FloatArray, *, alpha: float = 0.05, max_d: int = 2) -> int:
    """pmdarima's ``ndiffs(test="kpss")``: difference while KPSS rejects level stationarity."""
    from statsmodels.tsa.stattools import kpss

    def rejects(x: FloatArray) -> bool | None:
        lags = math.trunc(3.0 * math.sqrt(len(x)) / 13.0)  # pmdarima KPSSTest(lshort=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p_value = float(kpss(x, regression="c", nlags=lags)[1])
        return None if math.isnan(p_value) else p_value < alpha

    x = np.asarray(y, dtype=np.float64)
    if np.ptp(x) == 0:
        return 0
    should = rejects(x)
    if should is None:
        return 0
    d = 0
    while should and d < max_d:
        d += 1
        x = np.diff(x)
        if np.ptp(x) == 0:
            return d
        should = rejects(x)
        if should is None:
            return d - 1
    return d


def select_order(y: FloatArray) -> tuple[int, int, int]:
    """pmdarima ``auto_arima`` with its defaults (non-seasonal, stepwise, AIC, KPSS for ``d``).

    ``start_p = start_q = 2`` (1 below 10 points), ``max_p = max_q = min(5, n // 3)``,
    ``p + q <= 5``; tried first: ``(start_p, d, start_q)``, ``(0, d, 0)``, ``(1, d, 0)``,
    ``(0, d, 1)``, then the +-1 neighbours of the best ``p``, ``q`` and both, until none improves.
    """
    n = len(y)
    d = ndiffs_kpss(y)
    max_pq = min(5, max(n // 3, 0))
    start = min(2 if n >= 10 else 1, max_pq)
    scores: dict[tuple[int, int], float] = {}

    def score(p: int, q: int) -> float:
        if (p, q) not in scores:
            if not (0 <= p <= max_pq and 0 <= q <= max_pq and p + q <= 5):
                scores[(p, q)] = math.inf
            else:
                try:
                    scores[(p, q)] = _aic(_fit(y, (p, d, q)), (p, d, q))
                except (ValueError, np.linalg.LinAlgError):
                    scores[(p, q)] = math.inf
        return scores[(p, q)]

    for p, q in ((start, start), (0, 0), (1, 0), (0, 1)):
        score(p, q)
    best = min(scores, key=lambda k: scores[k])
    improved = True
    while improved:
        improved = False
        p, q = best
        for dp, dq in ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (1, 1), (-1, 1), (1, -1)):
            candidate = (p + dp, q + dq)
            if score(*candidate) < scores[best]:
                best = candidate
                improved = True
                break
    if not math.isfinite(scores[best]):
        return (0, d, 0)
    return (best[0], d, best[1])


class ArimaPredictor(_Buffer):
    """``ARIMAPredictor``: auto-ARIMA order chosen once at 5 points, then updated."""

    def __init__(self, *, log1p: bool = False, refit_every: int = 20, fit_window: int = 480) -> None:
        super().__init__()
        if refit_every < 1 or fit_window < MIN_POINTS:
            raise ValidationError(f"refit_every >= 1 and fit_window >= {MIN_POINTS} needed")
        self.log_space = log1p
        self.refit_every = refit_every
        self.fit_window = fit_window
        self.order: tuple[int, int, int] | None = None
        self._params: FloatArray | None = None
        self._fed = 0
        self._since_refit = 0

    def _series(self) -> FloatArray:
        y = np.asarray(self.data, dtype=np.float64)
        return np.log1p(np.maximum(y, 0.0)) if self.log_space else y

    def predict_next(self) -> float:
        if len(self.data) < MIN_POINTS:
            return self.last()
        if len(set(self.data)) == 1:
            return self.data[0]
        try:
            if self.order is None:
                self._select()
            elif self._fed < len(self.data):
                self._update()
            return self._forecast()
        except (ValueError, np.linalg.LinAlgError, IndexError):
            return self.last()

    def _select(self) -> None:
        order = select_order(self._series())
        if order[0] == 0 and order[2] == 0 and not self.log_space:
            self.log_space = True  # Dynamo: a (0, d, 0) order is refitted on log1p(y), for good
        self.order = order
        self._refit()

    def _refit(self) -> None:
        assert self.order is not None
        y = self._series()[-self.fit_window :]
        start = self._params
        result = _fit(y, self.order, start=start, maxiter=50 if start is None else 5)
        self._params = np.asarray(result.params, dtype=np.float64)  # type: ignore[attr-defined]
        self._fed = len(self.data)
        self._since_refit = 0

    def _update(self) -> None:
        self._since_refit += len(self.data) - self._fed
        self._fed = len(self.data)
        if self._since_refit >= self.refit_every:
            self._refit()

    def _forecast(self) -> float:
        """One step ahead with the current parameters, filtering the whole window (our recursion)."""
        assert self.order is not None and self._params is not None
        p, d, q = self.order
        params = self._params
        has_intercept = d in (0, 1)
        intercept = float(params[0]) if has_intercept else 0.0
        ar = params[int(has_intercept) : int(has_intercept) + p]
        ma = params[int(has_intercept) + p : int(has_intercept) + p + q]
        y = self._series()[-self.fit_window :]
        w = np.diff(y, n=d) if d else y
        errors = np.zeros(len(w))
        for t in range(len(w)):
            predicted = intercept
            for i in range(p):
                predicted += ar[i] * (w[t - 1 - i] if t - 1 - i >= 0 else 0.0)
            for j in range(q):
                predicted += ma[j] * (errors[t - 1 - j] if t - 1 - j >= 0 else 0.0)
            errors[t] = w[t] - predicted
        n = len(w)
        next_w = intercept + sum(ar[i] * w[n - 1 - i] for i in range(p) if n - 1 - i >= 0)
        next_w += sum(ma[j] * errors[n - 1 - j] for j in range(q) if n - 1 - j >= 0)
        value = _undifference(y, d, float(next_w))
        if self.log_space:
            value = math.expm1(value)
        return max(value, 0.0)


def _undifference(y: FloatArray, d: int, next_w: float) -> float:
    if d == 0:
        return next_w
    if d == 1:
        return float(y[-1]) + next_w
    return float(2 * y[-1] - y[-2]) + next_w


def make_predictor(kind: str) -> LoadPredictor:
    if kind == "constant":
        return ConstantPredictor()
    if kind == "arima":
        return ArimaPredictor()
    if kind == "kalman":
        return KalmanPredictor()
    raise ValidationError(f"unknown Dynamo predictor {kind!r}; choose from {', '.join(PREDICTORS)}")
