"""The routing window behind ``GET /v1/expert-load``, fed with routing deltas at the engine's rate."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import numpy as np

from contracts.imbalance import balancedness, imbalance_cv
from engine.engine_types import ExpertLoad
from engine.stats import IntArray, RoutingDelta, RoutingWindow, StatsSink, StepStats


class ExpertLoadTracker:
    """Thread-safe sliding window of routing counts; :meth:`snapshot` gives the plain-data view."""

    def __init__(self, window_steps: int) -> None:
        self.window_steps = window_steps
        self._lock = threading.Lock()
        self._window: RoutingWindow | None = None
        self._total: IntArray | None = None

    def add(self, delta: RoutingDelta) -> None:
        with self._lock:
            if self._window is None:
                layers, experts = delta.expert_tokens.shape
                self._window = RoutingWindow(layers, experts, delta.rank_tokens.shape[1], self.window_steps)
            self._window.add(delta)
            if self._total is None or self._total.shape != delta.expert_tokens.shape:
                self._total = np.zeros_like(delta.expert_tokens, dtype=np.int64)
            self._total += delta.expert_tokens

    def reset(self) -> None:
        """After a placement change: loads under the old placement no longer describe the ranks."""
        with self._lock:
            if self._window is not None:
                self._window.reset()

    def snapshot(self) -> ExpertLoad | None:
        """The window, or None before the first routed step (or with routing stats off)."""
        with self._lock:
            window = self._window
            if window is None:
                return None
            experts, ranks, steps = window.expert_tokens, window.rank_tokens, window.steps
            total = None if self._total is None else self._total.copy()
        return ExpertLoad(
            window_steps=self.window_steps,
            steps_in_window=steps,  # the steps the counts cover: the oldest delta may reach past window_steps
            expert_tokens=experts,
            rank_tokens=ranks,
            imbalance_cv=[float(x) for x in imbalance_cv(ranks)],
            balancedness=[float(x) for x in balancedness(ranks)],
            assignments=[int(x) for x in experts.sum(axis=1)],
            expert_tokens_total=total,
        )


__all__ = ["ExpertLoadTracker", "publish_step"]


def publish_step(stats: StepStats, load: ExpertLoadTracker, sinks: Iterable[StatsSink]) -> None:
    """One step's statistics into the expert-load window (reset by a placement swap) and every sink."""
    if stats.routing is not None:
        load.add(stats.routing)
    if stats.placement_swap is not None:
        load.reset()
    for sink in sinks:
        try:
            sink.record(stats)
        except Exception:  # a broken exporter must not stop serving
            logging.getLogger(__name__).exception("stats sink %r failed", sink)
