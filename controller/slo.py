"""SLI, error-budget and burn-rate math: pure functions over ratios and seconds.

Vocabulary (Google SRE workbook, "Alerting on SLOs"):

- *good ratio*: good events / all events over a window (requests whose TTFT
  was at or under the threshold, for example);
- *target*: the objective, e.g. ``0.99``; the *error budget* is ``1 - target``;
- *burn rate*: how fast the budget is spent relative to spending exactly all
  of it over the compliance window: ``(1 - good_ratio) / (1 - target)``.
  A burn rate of 1 empties the budget exactly at the end of the window;
- *burn-rate threshold* of an alert: the burn rate that spends
  ``budget_fraction`` of the budget within ``window_s``:
  ``budget_fraction * compliance_window_s / window_s``.  For a 30-day window,
  2 % in 1 h is 14.4, 5 % in 6 h is 6, 10 % in 1 d is 3, 10 % in 3 d is 1.

Multiwindow alerts fire when the burn rate exceeds the threshold over both a
long window and a short one (1/12 of the long), so they start fast and stop
fast.  :func:`standard_burn_rate_windows` lists the workbook's four pairs with
their thresholds derived from the compliance window, for the alert generator.
The slowest pair (3d/6h, a ticket) always fires above exactly 1: any burn that
would exhaust the budget within the compliance window raises at least a
ticket, whatever the window (28 days would give it 0.93, 90 days 3).  Another
pair whose threshold comes out below 1 (7 days gives 0.7 for 1d/2h) is left
out: a burn rate under 1 never exhausts the budget, so such an alert would fire
while the SLO is met.

Durations are seconds (``_s``) or Prometheus duration strings; see
:func:`format_duration` and :func:`controller.policy.parse_duration_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from scipy.special import bdtrc

from controller.policy import parse_duration_s

__all__ = [
    "MIN_ALERT_BURN_RATE",
    "MIN_ALERT_REQUESTS",
    "MISS_SIGNIFICANCE",
    "SHORT_WINDOW_DIVISOR",
    "BurnRateWindow",
    "ObjectiveStatus",
    "Severity",
    "burn_rate",
    "burn_rate_threshold",
    "burn_rates_by_window",
    "dropped_burn_rate_windows",
    "enough_requests",
    "error_budget",
    "error_budget_remaining",
    "error_ratio_threshold",
    "format_duration",
    "good_ratio",
    "is_burning",
    "misses_beyond_chance",
    "objective_status",
    "standard_burn_rate_windows",
]

Severity = Literal["page", "ticket"]

SHORT_WINDOW_DIVISOR = 12
"""The short window of a multiwindow alert is 1/12 of its long window (1h -> 5m)."""

MIN_ALERT_REQUESTS = 20
"""Requests the generated burn-rate alerts need over each pair's short window before they fire (the status page
holds its pairs to the same guard, :func:`enough_requests`).  A count, not a rate: over 5 minutes one slow
request among 20 is a 5 % error ratio, short of the fastest page's 14.4 % at a 99 % target (3 slow of 20 are
needed), while over a ticket's 2 h or 6 h short window 20 requests are a trickle (one every 6 or 18 minutes),
so a service that slow still gets its tickets."""
MIN_ALERT_BURN_RATE = 1.0
"""Burn-rate alerts below this factor are left out: at a burn rate <= 1 the budget lasts the window."""

_UNITS_S = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _check_target(target: float) -> None:
    if not 0.0 < target < 1.0:
        raise ValueError(f"SLO target must be in (0, 1), got {target!r}")


def good_ratio(good_events: float, total_events: float) -> float | None:
    """Fraction of good events; ``None`` when there were no events (no data is not 100 % good)."""
    if good_events < 0 or total_events < 0:
        raise ValueError(f"event counts must be >= 0, got good={good_events!r} total={total_events!r}")
    if total_events == 0:
        return None
    # Counters scraped at slightly different instants can put good a hair above total.
    return min(1.0, good_events / total_events)


def error_budget(target: float) -> float:
    """The allowed fraction of bad events, ``1 - target``."""
    _check_target(target)
    return 1.0 - target


def burn_rate(good_ratio_value: float, target: float) -> float:
    """``(1 - good_ratio) / (1 - target)``: 1.0 spends the budget exactly over the window."""
    if not 0.0 <= good_ratio_value <= 1.0:
        raise ValueError(f"good ratio must be in [0, 1], got {good_ratio_value!r}")
    return (1.0 - good_ratio_value) / error_budget(target)


MISS_SIGNIFICANCE = 0.05
"""Misses beyond the objective's share count as a burn only when chance at that share would give as
many less than one time in twenty (one-sided binomial test)."""


def misses_beyond_chance(good_ratio_value: float, events: float, target: float, *, clump: float = 1.0) -> bool:
    """Whether ``1 - good_ratio`` of ``events`` misses are more than chance gives at the objective's ``target``.

    Misses that come together (one stalled step delays the next token of every running request:
    ``clump`` of them at once) are counted as ``events / clump`` draws.  A burn rate above 1 over a
    handful of events says nothing: at 0.99, 2 misses in 100 gaps happen by chance 26 % of the time.
    """
    draws = events / max(clump, 1.0)
    misses = round((1.0 - min(max(good_ratio_value, 0.0), 1.0)) * draws)
    if misses == 0 or draws < 1:
        return False
    trials = round(draws)
    if misses > trials:
        return True  # more misses than draws: no chance gives that many
    # P(X >= misses) by the binomial's C kernel: scipy.stats' binom.sf gives the same figure in ~100 µs
    # a call, most of a 100-policy reactive tick.
    return float(bdtrc(misses - 1, trials, error_budget(target))) < MISS_SIGNIFICANCE


def error_budget_remaining(window_good_ratio: float, target: float) -> float:
    """Fraction of the compliance window's budget left, given the good ratio over that window.

    1.0 means untouched, 0.0 exactly spent; negative means overspent (kept
    negative, because how far over is worth showing).
    """
    return 1.0 - burn_rate(window_good_ratio, target)


def burn_rate_threshold(window_s: float, budget_fraction: float, compliance_window_s: float) -> float:
    """The burn rate that spends ``budget_fraction`` of the budget within ``window_s``.

    >>> round(burn_rate_threshold(3600, 0.02, 30 * 86400), 6)
    14.4
    """
    if window_s <= 0 or compliance_window_s <= 0:
        raise ValueError(f"windows must be > 0 s, got window_s={window_s!r}, compliance={compliance_window_s!r}")
    if window_s > compliance_window_s:
        raise ValueError(f"alert window {window_s!r} s exceeds the compliance window {compliance_window_s!r} s")
    if not 0.0 < budget_fraction <= 1.0:
        raise ValueError(f"budget fraction must be in (0, 1], got {budget_fraction!r}")
    return budget_fraction * compliance_window_s / window_s


def error_ratio_threshold(burn_rate_factor: float, target: float) -> float:
    """The bad-event ratio a burn-rate alert compares against: ``factor * (1 - target)``."""
    return burn_rate_factor * error_budget(target)


def is_burning(long_window_burn_rate: float, short_window_burn_rate: float, threshold: float) -> bool:
    """A multiwindow alert condition: both windows burn strictly faster than the threshold."""
    return long_window_burn_rate > threshold and short_window_burn_rate > threshold


def format_duration(seconds: float) -> str:
    """The shortest exact Prometheus duration for whole ``seconds`` (3600 -> ``"1h"``, 5400 -> ``"90m"``)."""
    whole = round(seconds)
    if whole <= 0 or not math.isclose(whole, seconds, abs_tol=1e-9):
        raise ValueError(f"duration must be a positive whole number of seconds, got {seconds!r}")
    for unit, size in _UNITS_S:
        if whole % size == 0:
            return f"{whole // size}{unit}"
    raise AssertionError("unreachable: every whole number of seconds divides by 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class BurnRateWindow:
    """One multiwindow burn-rate alert: fire when both windows burn faster than ``burn_rate``."""

    long_window_s: int
    short_window_s: int
    budget_fraction: float
    """Share of the compliance window's budget spent in ``long_window_s`` at ``burn_rate``."""
    burn_rate: float
    severity: Severity

    @property
    def long_window(self) -> str:
        return format_duration(self.long_window_s)

    @property
    def short_window(self) -> str:
        return format_duration(self.short_window_s)

    @classmethod
    def derive(
        cls, *, long_window: str, budget_fraction: float, severity: Severity, compliance_window_s: float
    ) -> BurnRateWindow:
        """A window pair from its long window and budget share; the short window is 1/12 of the long."""
        long_s = parse_duration_s(long_window)
        if long_s % SHORT_WINDOW_DIVISOR:
            raise ValueError(f"long window {long_window!r} must be a multiple of {SHORT_WINDOW_DIVISOR} s")
        return cls(
            long_window_s=long_s,
            short_window_s=long_s // SHORT_WINDOW_DIVISOR,
            budget_fraction=budget_fraction,
            burn_rate=burn_rate_threshold(long_s, budget_fraction, compliance_window_s),
            severity=severity,
        )


# (long window, budget fraction, severity): the SRE workbook's recommended alerts.
_STANDARD_WINDOWS: tuple[tuple[str, float, Severity], ...] = (
    ("1h", 0.02, "page"),
    ("6h", 0.05, "page"),
    ("1d", 0.10, "ticket"),
    ("3d", 0.10, "ticket"),
)


def standard_burn_rate_windows(compliance_window_s: float = 30 * 86400) -> tuple[BurnRateWindow, ...]:
    """The standard multiwindow alerts, thresholds derived from the compliance window.

    For 30 days: 1h/5m page at 14.4, 6h/30m page at 6, 1d/2h ticket at 3,
    3d/6h ticket at 1 (which fires only *above* 1).  Windows longer than the
    compliance window are left out.  The slowest pair left is held at
    :data:`MIN_ALERT_BURN_RATE` (28 days: 3d/6h at 1, not 0.93; 90 days: at 1, not 3),
    so a burn that would exhaust the budget within the window always tickets;
    another pair whose threshold is below it is left out: for 7 days 1h/5m (3.36),
    6h/30m (1.4) and 3d/6h (1) remain.  Under 50 hours, where no pair reaches 1
    of its own, none is kept (see :func:`dropped_burn_rate_windows`).
    """
    return _chosen_windows(compliance_window_s)[0]


def dropped_burn_rate_windows(compliance_window_s: float) -> tuple[BurnRateWindow, ...]:
    """The standard pairs left out for this compliance window because their threshold is below 1."""
    return _chosen_windows(compliance_window_s)[1]


def _chosen_windows(compliance_window_s: float) -> tuple[tuple[BurnRateWindow, ...], tuple[BurnRateWindow, ...]]:
    """(kept, dropped): the slowest pair at exactly 1x, faster ones kept where they reach 1x of their own."""
    derived = _derived_windows(compliance_window_s)
    if not any(_alertable(w) for w in derived):
        return (), derived
    *faster, slowest = derived
    at_budget_pace = replace(
        slowest, burn_rate=MIN_ALERT_BURN_RATE, budget_fraction=slowest.long_window_s / compliance_window_s
    )
    kept = tuple(w for w in faster if _alertable(w))
    return (*kept, at_budget_pace), tuple(w for w in faster if not _alertable(w))


def _derived_windows(compliance_window_s: float) -> tuple[BurnRateWindow, ...]:
    return tuple(
        BurnRateWindow.derive(
            long_window=long_window,
            budget_fraction=fraction,
            severity=severity,
            compliance_window_s=compliance_window_s,
        )
        for long_window, fraction, severity in _STANDARD_WINDOWS
        if parse_duration_s(long_window) <= compliance_window_s
    )


def _alertable(window: BurnRateWindow) -> bool:
    # round(): 10 % of 30 days in 3 days is 1.0 up to binary noise, and stays.
    return round(window.burn_rate, 9) >= MIN_ALERT_BURN_RATE


def enough_requests(request_rate_per_s: float, short_window_s: float) -> bool:
    """The generated alerts' low-traffic guard: at least :data:`MIN_ALERT_REQUESTS` requests over a pair's short
    window, given the request rate over it (the rules read ``rate(...[short]) * short_s``, its increase)."""
    return request_rate_per_s * short_window_s >= MIN_ALERT_REQUESTS


def burn_rates_by_window(good_ratio_by_window: Mapping[str, float], target: float) -> dict[str, float]:
    """Burn rate per window (same keys, e.g. ``"5m"``); ratios are clipped into [0, 1] first.

    Clipping absorbs counters read a moment apart (a ratio of 1.0000001), never real data.
    """
    return {window: burn_rate(min(max(ratio, 0.0), 1.0), target) for window, ratio in good_ratio_by_window.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectiveStatus:
    """Where one objective stands: budget left over the compliance window, burn rates, alerts firing."""

    target: float
    compliance_window: str
    good_ratio: float | None
    """Over the compliance window; ``None`` when that window has no data yet."""
    error_budget_remaining: float | None
    burn_rates: Mapping[str, float] = field(default_factory=dict)
    firing: tuple[BurnRateWindow, ...] = ()
    """Multiwindow alerts whose long and short windows both burn above their threshold."""


def objective_status(
    good_ratio_by_window: Mapping[str, float],
    target: float,
    compliance_window_s: float,
    windows: Sequence[BurnRateWindow] | None = None,
) -> ObjectiveStatus:
    """Summarize one objective from its good ratios keyed by Prometheus duration.

    Keys are matched by the seconds they stand for, so a source that keys by the
    policy's own spelling (``"7d"``, ``"24h"``) finds the same windows as
    :func:`format_duration` spells them (``"1w"``, ``"1d"``); ``compliance_window``
    in the result is the key found for it (or the canonical spelling without data).
    ``windows`` defaults to :func:`standard_burn_rate_windows` for the
    compliance window; an alert whose long or short window has no ratio is not
    evaluated (missing data never fires and never clears an alert here).
    """
    rates = burn_rates_by_window(good_ratio_by_window, target)
    key_by_s: dict[int, str] = {}
    for key in good_ratio_by_window:
        try:
            key_by_s.setdefault(parse_duration_s(key), key)
        except ValueError:
            continue  # not a duration: kept in burn_rates, matches no window
    compliance = key_by_s.get(round(compliance_window_s), format_duration(compliance_window_s))
    window_ratio = good_ratio_by_window.get(compliance)
    chosen = standard_burn_rate_windows(compliance_window_s) if windows is None else tuple(windows)

    def rate_over(window_s: int) -> float | None:
        key = key_by_s.get(window_s)
        return None if key is None else rates[key]

    firing = []
    for w in chosen:
        long_rate, short_rate = rate_over(w.long_window_s), rate_over(w.short_window_s)
        if long_rate is not None and short_rate is not None and is_burning(long_rate, short_rate, w.burn_rate):
            firing.append(w)
    return ObjectiveStatus(
        target=target,
        compliance_window=compliance,
        good_ratio=window_ratio,
        error_budget_remaining=None if window_ratio is None else 1.0 - rates[compliance],
        burn_rates=rates,
        firing=tuple(firing),
    )
