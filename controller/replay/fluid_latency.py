"""Latency distributions of the fluid fleet: one tail function per SLO, so good ratios and p99s agree.

Per tick, each latency is described by its tail ``P(latency > x)`` on a fixed grid of
``x`` (and exactly at the SLO threshold):

- TTFT = fixed cost (per-request overhead, the wait to clear a backlog) + the M/G/1
  queue wait + the prompt's own prefill.  The wait is zero with probability
  ``1 - rho`` and otherwise exponential with mean ``mean_wait / rho``; the prefill time
  follows the true prompt-length distribution (its quantiles, scaled to the tick's
  mean prompt), so ``P(TTFT > x) = mean_i min(1, rho * exp(-rho * (x - c - s_i) / mean_wait))``
  (1 where a prompt alone exceeds ``x``);
- ITL = ``step(R) / (1 - rho_p)`` with the running batch ``R`` normal around its mean
  (Poisson spread).

A window's p99 is the 99th percentile of the mixture of its ticks (weighted by the
requests each finished), read off the averaged tail: the same numbers the good
ratios come from, so a window whose good ratio is above 99 % has its p99 under the
threshold.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from scipy.special import ndtr

from contracts.traces import FloatArray, IntArray

__all__ = ["ITL_GRID_S", "TTFT_GRID_S", "WindowTails", "itl_tail", "prompt_shape", "ttft_tail"]

TTFT_GRID_S: FloatArray = np.geomspace(0.005, 300.0, 72)
ITL_GRID_S: FloatArray = np.geomspace(0.001, 5.0, 72)
_SHAPE_POINTS = 64


def prompt_shape(prompts: IntArray | None, points: int = _SHAPE_POINTS) -> FloatArray:
    """Prompt lengths over their mean at evenly spaced quantiles (unknown: exponential, cv^2 = 1)."""
    levels = (np.arange(points) + 0.5) / points
    if prompts is None or len(prompts) == 0 or float(np.mean(prompts)) <= 0:
        exponential: FloatArray = -np.log1p(-levels)
        return exponential
    values = np.asarray(prompts, dtype=np.float64)
    shape: FloatArray = np.quantile(values, levels) / float(values.mean())
    return shape


def ttft_tail(
    x: FloatArray, *, fixed_s: float, service_s: FloatArray, rho: float, mean_wait_s: float
) -> FloatArray:
    """``P(TTFT > x)`` for each ``x``; ``service_s`` are the prefill times of the prompts' quantiles."""
    slack = x[:, None] - fixed_s - service_s[None, :]
    if mean_wait_s > 0 and rho > 0:
        late = np.minimum(rho * np.exp(-rho * np.maximum(slack, 0.0) / mean_wait_s), 1.0)
    else:
        late = np.zeros_like(slack)
    tail: FloatArray = np.where(slack <= 0, 1.0, late).mean(axis=1)
    return tail


def itl_tail(x: FloatArray, *, base_s: float, per_seq_s: float, rho_prefill: float, running: float) -> FloatArray:
    """``P(ITL > x)`` for each ``x``, the running batch normal with a Poisson spread."""
    if rho_prefill >= 1:
        return np.ones_like(x)
    spread = math.sqrt(max(running, 1.0))
    limit = (x * (1.0 - rho_prefill) - base_s) / max(per_seq_s, 1e-12)
    tail: FloatArray = 1.0 - ndtr((limit - running) / spread)
    return tail


def _quantile(grid: FloatArray, tail: FloatArray, level: float) -> float:
    """Smallest grid-interpolated ``x`` with ``tail(x) <= level`` (inf beyond the grid)."""
    below = np.flatnonzero(tail <= level)
    if len(below) == 0:
        return float(grid[-1])  # as histogram_quantile answers from the highest finite bucket
    j = int(below[0])
    if j == 0:
        return float(grid[0])
    t0, t1 = float(tail[j - 1]), float(tail[j])
    share = 1.0 if t0 == t1 else (t0 - level) / (t0 - t1)
    return float(grid[j - 1] * (grid[j] / grid[j - 1]) ** share)  # geometric grid: interpolate in log x


class WindowTails:
    """The tails of the last ticks of a window, weighted by requests finished, and their mixture p99."""

    def __init__(self, ticks: int) -> None:
        self._ticks: deque[tuple[float, FloatArray, FloatArray]] = deque(maxlen=max(ticks, 1))

    def add(self, finished: float, ttft: FloatArray | None, itl: FloatArray | None) -> None:
        if finished > 0 and ttft is not None and itl is not None:
            self._ticks.append((finished, ttft, itl))
        else:
            self._ticks.append((0.0, TTFT_GRID_S * 0.0, ITL_GRID_S * 0.0))

    def p99(self) -> tuple[float | None, float | None]:
        total = sum(w for w, _, _ in self._ticks)
        if total <= 0:
            return None, None
        ttft: FloatArray = np.sum([w * t for w, t, _ in self._ticks], axis=0) / total
        itl: FloatArray = np.sum([w * i for w, _, i in self._ticks], axis=0) / total
        return _quantile(TTFT_GRID_S, ttft, 0.01), _quantile(ITL_GRID_S, itl, 0.01)
