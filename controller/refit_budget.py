"""How many forecast refits run after one controller tick (``DecisionCore.refit``), over all policies.

A full refit (backtest, selection, fit) costs tens of milliseconds: one of a long history, or of a young one
whose selection fits Holt or ARIMA; 100 policies started together reach their early refits (each time a short
history doubles) on the same ticks.  Full refits and cheap ones (a young history's, fitting neither) are both
budgeted per tick, a tick runs one kind only (so its refits cost at most the larger budget), and
a kind that waited for the other goes first on the next tick, so neither starves the other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sized
from typing import Protocol

__all__ = ["CHEAP_REFIT_BINS", "RefitBudget"]

log = logging.getLogger(__name__)

CHEAP_REFIT_BINS = 256
"""A refit over fewer bins that fits no parametric model (``refit_is_cheap``: last value, moving average or
seasonal naive only) is cheap, about 0.03 ms a bin: such refits share a budget of bins.  One that fits Holt or
ARIMA costs 7-75 ms (7 ms at 40 bins, about 20 ms at 200-300), so it counts as a full refit."""


class Refittable(Protocol):
    @property
    def refit_due(self) -> bool: ...

    @property
    def refit_is_cheap(self) -> bool: ...

    @property
    def history(self) -> Sized: ...

    @property
    def bins_since_fit(self) -> int: ...

    def refit(self) -> None: ...


class RefitBudget:
    """``full_per_tick`` full refits, or cheap ones up to ``short_bins_per_tick`` bins, a tick."""

    def __init__(self, full_per_tick: int, short_bins_per_tick: int) -> None:
        self.full_per_tick = full_per_tick
        self.short_bins_per_tick = short_bins_per_tick
        self.deferred = 0
        """Refits that waited for a later tick's budget (since start)."""
        self._tick_s: float | None = None
        self._full_left = 0
        self._short_bins_left = 0
        self._first_kind: str | None = None
        """``full`` or ``short``: the kind that waited for the other last tick goes first this tick."""
        self._full_waited = self._short_waited = False
        self._ran_kind: str | None = None
        """The kind of the last refit run."""

    def refit_if_due(self, forecaster: Refittable, now_s: float) -> None:
        """Refit ``forecaster`` now if it is due and this tick's budget allows; else it keeps its model."""
        if now_s != self._tick_s:
            self._start_tick(now_s)
        if not forecaster.refit_due:
            return
        bins = len(forecaster.history)
        short = bins < CHEAP_REFIT_BINS and forecaster.refit_is_cheap
        full_ran = self._full_left < self.full_per_tick
        short_ran = self._short_bins_left < self.short_bins_per_tick
        if short:
            blocked = self._first_kind == "full" or full_ran  # the other kind's tick
            run = not blocked and self._short_bins_left >= bins
            self._short_waited = self._short_waited or blocked
        else:
            blocked = self._first_kind == "short" or short_ran
            run = not blocked and self._full_left > 0
            self._full_waited = self._full_waited or blocked
        if not run:
            self.deferred += 1
            return
        forecaster.refit()
        self._ran_kind = "short" if short else "full"
        if short:
            self._short_bins_left -= bins
        else:
            self._full_left -= 1

    def refit_all(self, forecasters: Mapping[str, Refittable], now_s: float) -> dict[str, str]:
        """:meth:`refit_if_due` for each forecaster, the longest unfitted first (then by name); why the refits that
        raised failed, by name (the forecaster keeps its model: one policy's numerics must not stop the others').

        The longest unfitted first: in name order, more policies than the budget refits in a cadence starved the
        last names for ever; and a warm-started model (a moving average, no interval) waits least."""
        failed = {}
        for name, forecaster in sorted(forecasters.items(), key=lambda item: (-item[1].bins_since_fit, item[0])):
            try:
                self.refit_if_due(forecaster, now_s)
            except Exception as exc:
                log.exception("forecast refit of %s failed", name)
                failed[name] = f"{type(exc).__name__}: {exc}"[:200]
        return failed

    def _start_tick(self, now_s: float) -> None:
        if self._full_waited and self._short_waited:
            self._first_kind = "short" if self._ran_kind == "full" else "full"
        elif self._full_waited or self._short_waited:
            self._first_kind = "full" if self._full_waited else "short"
        else:
            self._first_kind = None
        self._tick_s, self._full_left, self._short_bins_left = now_s, self.full_per_tick, self.short_bins_per_tick
        self._full_waited = self._short_waited = False
