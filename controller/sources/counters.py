"""Cumulative counters read by scraping, folded into increases as Prometheus's ``increase()`` and ``rate()`` do.

Shared by the engines' pages (:mod:`controller.sources.scrape`) and the entry router's
(:mod:`controller.sources.router_page`).  History stays bounded: every point is kept for
the last hour, older points are thinned to one per five minutes and keep only the
counters the caller says it still needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["COARSE_SPACING_S", "FINE_HISTORY_S", "CounterHistory", "counter_peak_rate", "counter_rate"]

FINE_HISTORY_S = 3600.0
COARSE_SPACING_S = 300.0


@dataclass
class CounterHistory:
    """Increase accumulators of cumulative counters (one model's, one router's) and their history on the
    caller's clock."""

    totals: dict[str, float] = field(default_factory=dict)
    points: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def add(self, key: str, value: float, previous: float | None) -> None:
        """Fold one read of a counter into its accumulator, as Prometheus's ``increase()`` does: a value below
        the previous read is a restart counting from zero; the first read (``previous`` None) is a baseline,
        its counts from before belong to no window."""
        self.totals.setdefault(key, 0.0)
        if previous is not None:
            self.totals[key] += value if value < previous else value - previous

    def record(self, now_s: float, keep_coarse: Callable[[str], bool], max_age_s: float) -> None:
        self.points.append((now_s, dict(self.totals)))
        # Thin points older than the fine horizon to one per COARSE_SPACING_S, keeping SLO counters only.
        fine_start = now_s - FINE_HISTORY_S
        while self.points and self.points[0][0] < now_s - max_age_s:
            self.points.popleft()
        thinned: deque[tuple[float, dict[str, float]]] = deque()
        last_kept: float | None = None
        for at_s, totals in self.points:
            if at_s >= fine_start:
                thinned.append((at_s, totals))
                continue
            if last_kept is None or at_s - last_kept >= COARSE_SPACING_S:
                thinned.append((at_s, {k: v for k, v in totals.items() if keep_coarse(k)}))
                last_kept = at_s
        self.points = thinned

    def increase(self, key: str, now_s: float, window_s: float) -> tuple[float, float] | None:
        """(increase of ``key`` over the window, seconds actually covered), None without history."""
        if key not in self.totals or len(self.points) < 2:
            return None
        cutoff_s = now_s - window_s
        then: tuple[float, float] | None = None
        for at_s, totals in self.points:
            if key not in totals:
                continue
            if at_s <= cutoff_s:
                then = (at_s, totals[key])
                continue
            if then is None:
                then = (at_s, totals[key])  # history shorter than the window: cover what exists
            break
        if then is None or then[0] >= now_s:
            return None
        return self.totals[key] - then[1], now_s - then[0]


def counter_peak_rate(history: CounterHistory, key: str, now_s: float, window_s: float, step_s: float) -> float | None:
    """The highest per-second increase of ``key`` between reads at least ``step_s`` apart, both in the window
    (``max_over_time(rate(key[step])[window:])``); None without two such reads."""
    reads = [(at_s, totals[key]) for at_s, totals in history.points if at_s >= now_s - window_s and key in totals]
    peak: float | None = None
    start = 0
    for at_s, value in reads:
        # The latest read at least step_s before this one (reads are in time order).
        while start + 1 < len(reads) and reads[start + 1][0] <= at_s - step_s:
            start += 1
        then_s, then = reads[start]
        if at_s - then_s >= step_s:
            rate = (value - then) / (at_s - then_s)
            peak = rate if peak is None else max(peak, rate)
    return peak


def counter_rate(history: CounterHistory, key: str, now_s: float, window_s: float) -> float | None:
    """Per-second increase of ``key`` over the window (None without two points in it)."""
    delta = history.increase(key, now_s, window_s)
    if delta is None or delta[1] <= 0:
        return None
    return delta[0] / delta[1]
