"""Latency distributions of the fluid fleet: one tail function per SLO, so good ratios and p99s agree.

Per tick, each latency is described by its tail ``P(latency > x)`` at the engines' histogram
edges (and exactly at the SLO threshold):

- TTFT = fixed cost (per-request overhead, the wait to clear a backlog) + the M/G/1
  queue wait + the prompt's own prefill.  The wait is zero with probability
  ``1 - rho`` and otherwise exponential with mean ``mean_wait / rho``; the prefill time
  follows the true prompt-length distribution (its quantiles, scaled to the tick's
  mean prompt), so ``P(TTFT > x) = mean_i min(1, rho * exp(-rho * (x - c - s_i) / mean_wait))``
  (1 where a prompt alone exceeds ``x``);
- ITL = ``step(R) / (1 - rho_p)`` with the running batch ``R`` normal around its mean
  (Poisson spread).

The tails become the ticks' bucket counts, which the controllers read as Prometheus
does (:mod:`controller.replay.signals`): a window's p99 and good ratios come from the
same counts.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

from contracts.traces import FloatArray, IntArray

__all__ = ["itl_tail", "prompt_shape", "ttft_tail"]

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
