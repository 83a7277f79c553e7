"""Forecasts that audit themselves: every forecast is scored against what arrived.

Each tick the controller forecasts the bin one lead time ahead; when that bin's
actual value arrives, the forecast is scored.  Over the last ``window`` scored
forecasts the audit keeps the WAPE (sum of absolute errors over sum of actuals)
and the empirical coverage of the prediction interval (the share of actuals
between its lower and upper bounds).  A forecast whose error or coverage drifts
past its bounds is *unreliable*; it becomes reliable again only when both are
back inside with a margin (hysteresis, so the controller does not flap between
forecast and reactive sizing).

When the actuals are rates of arrivals counted over a window (``count_window_s``),
even a perfect forecast of the arrival rate scores a WAPE: the counts' Poisson
noise, E|N - mu| / mu, which is 0.25 at ten arrivals a window and 0.65 at 1.6.
The audit takes that noise floor from the forecasts' mean rate over the window (the
error they would score if that rate were right) and holds only the WAPE above it
against the bound, so a quiet service is not distrusted for the noise of its own
arrivals (as the rebalancer judges imbalance against its sampling floor).  Taken
from each actual instead, the floor falls short at a few arrivals a window (half at
0.5: a count of 0 claims no noise); taken from each forecast, it fell short the same
way, since on a quiet service the selection picks forecasts near the median count,
0 most of the time (a steady 0.3 requests a minute was distrusted on 83 % of ticks);
taken from the window's mean actual, it would hide a forecast too low for a quiet
service, where this one is lenient only with one too high (which costs replicas, not
objectives): a forecast 70 % low still scores above its own, lower floor.

Pure and O(1) per bin: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from contracts.errors import ValidationError

__all__ = ["MIN_SCORED", "AuditBounds", "ForecastAudit", "ScoredForecast", "poisson_mean_abs_deviation"]

MIN_SCORED = 8
"""Scored forecasts the audit waits for before it judges, where its window holds that many."""

RECOVERY_MARGIN = 0.8
"""A drifted forecast is trusted again once its WAPE is below this share of the bound (and its
coverage above the bound by the same relative margin)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditBounds:
    max_wape: float = 0.5
    min_coverage: float = 0.5
    window: int = 40
    """Scored forecasts the rolling figures cover."""
    min_scored: int = MIN_SCORED
    """Fewer scored forecasts than this: too early to distrust the forecast (at most ``window``, which would
    otherwise never hold enough to judge)."""
    min_actual_mean: float = 1e-6
    """Mean actual below this (an idle service): WAPE is undefined, the forecast is not judged."""
    count_window_s: float | None = None
    """The actuals are arrivals counted over this window, per second: the WAPE their Poisson noise alone
    gives is not held against the forecast (None: the actuals are taken as exact)."""

    def __post_init__(self) -> None:
        problems = []
        if self.window < 1 or self.min_scored < 1:
            problems.append("window and min_scored must be >= 1")
        if self.min_scored > self.window:
            problems.append(f"min_scored ({self.min_scored}) must be <= window ({self.window})")
        if not 0 <= self.min_coverage <= 1:
            problems.append(f"min_coverage must be in [0, 1], got {self.min_coverage}")
        if self.count_window_s is not None and self.count_window_s <= 0:
            problems.append(f"count_window_s must be > 0, got {self.count_window_s}")
        if problems:
            raise ValidationError(problems)


def poisson_mean_abs_deviation(mean: float) -> float:
    """E|N - mean| for N ~ Poisson(mean): 2 e^-mean mean^(k+1) / k!, k = floor(mean) (computed in logs)."""
    if mean <= 0:
        return 0.0
    k = math.floor(mean)
    return 2.0 * math.exp(-mean + (k + 1) * math.log(mean) - math.lgamma(k + 1))


@dataclass(frozen=True, slots=True)
class ScoredForecast:
    target_bin: int
    actual: float
    point: float
    lower: float
    upper: float

    @property
    def has_interval(self) -> bool:
        """False for a point forecast (no error distribution yet): it says nothing about coverage."""
        return self.upper > self.lower

    @property
    def covered(self) -> bool:
        return self.has_interval and self.lower <= self.actual <= self.upper


class ForecastAudit:
    """Predicted against actual for one series, bin by bin."""

    def __init__(self, bounds: AuditBounds | None = None) -> None:
        self.bounds = bounds or AuditBounds()
        self._pending: deque[tuple[int, float, float, float]] = deque()
        self._scored: deque[ScoredForecast] = deque(maxlen=self.bounds.window)
        self._abs_error = 0.0
        self._actual = 0.0
        self._point = 0.0
        self._covered = 0
        self._with_interval = 0
        self.reliable = True
        """Current verdict (with hysteresis)."""

    def expect(self, target_bin: int, *, point: float, lower: float, upper: float) -> None:
        """Record the forecast made now for ``target_bin`` (bins are counted by the caller)."""
        if self._pending and target_bin <= self._pending[-1][0]:
            return  # one forecast per target bin: the first one made a lead time ahead
        self._pending.append((target_bin, point, lower, upper))

    def observe(self, bin_index: int, actual: float) -> ScoredForecast | None:
        """The actual value of ``bin_index``: score the forecast made for it, if any."""
        while self._pending and self._pending[0][0] < bin_index:
            self._pending.popleft()  # bins that were never observed (a gap): nothing to score
        if not self._pending or self._pending[0][0] != bin_index:
            return None
        _, point, lower, upper = self._pending.popleft()
        scored = ScoredForecast(bin_index, actual, point, lower, upper)
        self._add(scored)
        self._judge()
        return scored

    def rebound(self, bounds: AuditBounds) -> ForecastAudit:
        """This audit under other bounds (the policy's changed): the forecasts awaited and the last ``window``
        scored carry over, and so does the verdict, judged again under the new bounds (with its hysteresis), so
        a tighter bound does not trust a forecast just distrusted until enough new ones are scored."""
        audit = ForecastAudit(bounds)
        audit._pending = deque(self._pending)
        for scored in self._scored:
            audit._add(scored)
        audit.reliable = self.reliable
        audit._judge()
        return audit

    def _add(self, scored: ScoredForecast) -> None:
        if len(self._scored) == self._scored.maxlen:
            self._forget(self._scored[0])
        self._scored.append(scored)
        self._abs_error += abs(scored.actual - scored.point)
        self._actual += abs(scored.actual)
        self._point += scored.point
        self._covered += scored.covered
        self._with_interval += scored.has_interval

    def _forget(self, old: ScoredForecast) -> None:
        self._abs_error -= abs(old.actual - old.point)
        self._actual -= abs(old.actual)
        self._point -= old.point
        self._covered -= old.covered
        self._with_interval -= old.has_interval

    def _noise_of(self, point: float) -> float:
        """The absolute error a forecast of this rate expects against the counted actual if the rate is right."""
        window = self.bounds.count_window_s
        if window is None or point <= 0:
            return 0.0
        return poisson_mean_abs_deviation(point * window) / window

    @property
    def scored(self) -> int:
        return len(self._scored)

    @property
    def wape(self) -> float | None:
        """Rolling WAPE, or None while too few forecasts were scored or the series is idle."""
        n = len(self._scored)
        if n < self.bounds.min_scored or self._actual / n < self.bounds.min_actual_mean:
            return None
        return max(self._abs_error, 0.0) / self._actual

    @property
    def noise_floor(self) -> float | None:
        """The WAPE the counting noise alone gives forecasts of these forecasts' mean rate were it right (None with
        :attr:`wape`)."""
        n = len(self._scored)
        return None if self.wape is None else n * self._noise_of(max(self._point, 0.0) / n) / self._actual

    @property
    def excess_wape(self) -> float | None:
        """The WAPE above the noise floor: what the bound judges."""
        wape, floor = self.wape, self.noise_floor
        return None if wape is None or floor is None else max(0.0, wape - floor)

    @property
    def coverage(self) -> float | None:
        """Share of actuals inside the interval, over the scored forecasts that had one."""
        n = self._with_interval
        return None if n < self.bounds.min_scored else self._covered / n

    def _judge(self) -> None:
        wape, coverage = self.excess_wape, self.coverage
        bounds = self.bounds
        if self.reliable:
            drifted = (wape is not None and wape > bounds.max_wape) or (
                coverage is not None and coverage < bounds.min_coverage
            )
            self.reliable = not drifted
            return
        recovered_wape = wape is None or wape <= RECOVERY_MARGIN * bounds.max_wape
        recovered_coverage = coverage is None or coverage >= self._recovery_coverage()
        self.reliable = recovered_wape and recovered_coverage

    def _recovery_coverage(self) -> float:
        low = self.bounds.min_coverage
        return low + (1 - RECOVERY_MARGIN) * (1 - low)

    def why_unreliable(self) -> str:
        """What keeps the forecast distrusted (for the decision's detail)."""
        wape, excess, floor, coverage = self.wape, self.excess_wape, self.noise_floor, self.coverage
        parts = []
        if wape is not None and excess is not None and excess > RECOVERY_MARGIN * self.bounds.max_wape:
            above = f", {excess:.2f} above the noise floor {floor:.2f}" if floor else ""
            parts.append(f"WAPE {wape:.2f}{above} (bound {self.bounds.max_wape:.2f})")
        if coverage is not None and coverage < self._recovery_coverage():
            parts.append(f"interval coverage {coverage:.2f} (bound {self.bounds.min_coverage:.2f})")
        return ", ".join(parts) or "recovering"
