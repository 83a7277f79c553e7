"""Expert-load imbalance: the one math the engine, the vLLM plugin, the exporters and the rebalancer share.

Imbalance follows the mission: the coefficient of variation (stddev / mean)
of the per-rank load of one layer, the SLO's measure.  Balancedness is vLLM's
and SGLang's ``mean / max`` of the same loads; ``max / mean`` is EPLB's.  Every
function takes per-rank load along the last axis, so a (layers, ranks) array
gives one figure per layer.  numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.errors import PlacementError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ACROSS_LAYER_STATS = ("min", "median", "max")
"""The summary of a per-layer figure over layers (the ``stat`` label of ``moe_*_across_layers``)."""


def imbalance_cv(load: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """CV of per-rank load along the last axis; 0 where the load is all zero."""
    arr = np.asarray(load, dtype=np.float64)
    mean = arr.mean(axis=-1)
    std = arr.std(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, std / np.where(mean > 0, mean, 1.0), 0.0)


def balancedness(load: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """mean / max of per-rank load along the last axis; 1 where all zero."""
    arr = np.asarray(load, dtype=np.float64)
    peak = arr.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(peak > 0, arr.mean(axis=-1) / np.where(peak > 0, peak, 1.0), 1.0)


def max_over_mean(load: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """max / mean of per-rank load along the last axis (EPLB's figure); 1 where all zero."""
    arr = np.asarray(load, dtype=np.float64)
    mean = arr.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, arr.max(axis=-1) / np.where(mean > 0, mean, 1.0), 1.0)


def sampling_noise_cv(assignments: npt.ArrayLike, num_ranks: int, shares: npt.ArrayLike | None = None) -> FloatArray:
    """The CV a window of ``assignments`` routed tokens shows from sampling alone.

    Routing each assignment to rank ``r`` with probability ``p_r`` makes the per-rank counts
    multinomial, and the squared CV measured over the window is, in expectation, the squared CV
    of ``p`` plus ``R (1 - sum p_r^2) / N``.  With ``shares`` None the routing is taken as
    perfectly balanced (``p_r = 1/R``), which gives the floor ``sqrt((R - 1) / N)``: what a
    balanced placement still measures over a short, low-traffic window.  Infinite where N is 0.
    """
    n = np.asarray(assignments, dtype=np.float64)
    if shares is None:
        spread = np.full_like(n, (num_ranks - 1) / max(num_ranks, 1), dtype=np.float64)
    else:
        p = np.asarray(shares, dtype=np.float64)
        total = p.sum(axis=-1, keepdims=True)
        p = np.divide(p, total, out=np.full_like(p, 1.0 / max(num_ranks, 1)), where=total > 0)
        spread = 1.0 - (p * p).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, np.sqrt(num_ranks * spread / np.where(n > 0, n, 1.0)), np.inf)


def denoised_cv(measured_cv: npt.ArrayLike, noise_cv: npt.ArrayLike) -> FloatArray:
    """The CV of the routing itself: the measured CV with the sampling noise taken out (never below 0)."""
    measured = np.asarray(measured_cv, dtype=np.float64)
    noise = np.nan_to_num(np.asarray(noise_cv, dtype=np.float64), posinf=np.inf)
    out: FloatArray = np.sqrt(np.maximum(measured * measured - noise * noise, 0.0))
    return out


def across_layers(per_layer: npt.ArrayLike) -> dict[str, float]:
    """Min, median and max of a per-layer figure; empty when there are no layers."""
    arr = np.asarray(per_layer, dtype=np.float64)
    if arr.size == 0:
        return {}
    return {"min": float(np.min(arr)), "median": float(np.median(arr)), "max": float(np.max(arr))}


@dataclass(frozen=True, eq=False)
class Imbalance:
    """Per-layer imbalance of per-rank load: EPLB's max/mean and the SLO's CV (stddev/mean)."""

    max_over_mean: FloatArray
    cv: FloatArray

    @classmethod
    def of(cls, rank_load: FloatArray) -> Imbalance:
        return cls(max_over_mean(rank_load), imbalance_cv(rank_load))

    def summary(self, mask: npt.NDArray[np.bool_] | None = None) -> dict[str, float]:
        """Average and worst layer of both figures (over ``mask`` layers, default all)."""
        mom, cv = (self.max_over_mean, self.cv) if mask is None else (self.max_over_mean[mask], self.cv[mask])
        if mom.size == 0:
            return {"max_over_mean_avg": 1.0, "max_over_mean_worst": 1.0, "cv_avg": 0.0, "cv_worst": 0.0}
        return {
            "max_over_mean_avg": float(mom.mean()),
            "max_over_mean_worst": float(mom.max()),
            "cv_avg": float(cv.mean()),
            "cv_worst": float(cv.max()),
        }

    def to_json(self, mask: npt.NDArray[np.bool_] | None = None) -> dict[str, Any]:
        return {
            "max_over_mean": self.max_over_mean.tolist(),
            "cv": self.cv.tolist(),
            "summary": self.summary(mask),
        }


def count_replicas(phy2log: IntArray, num_experts: int) -> IntArray:
    """(layers, experts) replicas of each logical expert: one ``bincount`` over every layer (``np.add.at`` is
    many times slower).  PlacementError for an id outside ``[0, num_experts)`` (it would count in another layer)."""
    if phy2log.size and (phy2log.min() < 0 or phy2log.max() >= num_experts):
        raise PlacementError(f"expert ids must be in [0, {num_experts}), got {phy2log.min()}..{phy2log.max()}")
    layers = phy2log.shape[0]
    keys = (np.arange(layers, dtype=np.int64)[:, None] * num_experts + phy2log).ravel()
    out: IntArray = np.bincount(keys, minlength=layers * num_experts).reshape(layers, num_experts)
    return out


def rank_load(phy2log: IntArray, load: FloatArray, num_ranks: int) -> FloatArray:
    """(layers, ranks) load each rank carries when replicas split their expert's load evenly (the engine's rule)."""
    layers, num_slots = phy2log.shape
    counts = count_replicas(phy2log, load.shape[1])
    per_replica = np.divide(load, counts, out=np.zeros_like(load), where=counts > 0)
    slot_load = np.take_along_axis(per_replica, phy2log, axis=1)
    out: FloatArray = slot_load.reshape(layers, num_ranks, num_slots // num_ranks).sum(axis=2)
    return out


def rank_dispersion(windows: npt.ArrayLike, phy2log: IntArray, num_ranks: int) -> float:
    """How much more the ranks' shares vary between windows than independent routing explains (at least 1).

    :func:`sampling_noise_cv` takes every routed assignment as an independent draw.  They are not:
    a token's top-k assignments go together, a request's decode tokens route alike, and the hot
    experts drift.  Over windows of expert load ``(windows, layers, experts)`` mapped to ranks by
    ``phy2log``, this is Pearson's chi-square of homogeneity (windows x ranks, per layer) over its
    degrees of freedom, pooled over layers: the overdispersion of quasi-likelihood models, about 1
    for independent draws.  Noise widths scale with its square root.  1 with fewer than two windows.
    """
    return pooled_rank_dispersion([windows], phy2log, num_ranks)


def pooled_rank_dispersion(groups: Sequence[npt.ArrayLike], phy2log: IntArray, num_ranks: int) -> float:
    """:func:`rank_dispersion` with the chi-square and its degrees of freedom summed over groups of windows, each
    tested within itself: windows of two engines whose traffic mixes differ do not count that difference."""
    statistic, dof = 0.0, 0
    for windows in groups:
        loads = np.asarray(windows, dtype=np.float64)
        if loads.ndim != 3 or loads.shape[0] < 2 or num_ranks < 2:
            continue
        table = np.stack([rank_load(phy2log, w, num_ranks) for w in loads], axis=1)  # (layers, windows, ranks)
        rows = table.sum(axis=2, keepdims=True)
        cols = table.sum(axis=1, keepdims=True)
        total = rows.sum(axis=1, keepdims=True)
        expected = np.divide(rows * cols, total, out=np.zeros_like(table), where=total > 0)
        cells = np.divide((table - expected) ** 2, expected, out=np.zeros_like(table), where=expected > 0)
        windows_with_load = (rows[..., 0] > 0).sum(axis=1)
        ranks_with_load = (cols[:, 0, :] > 0).sum(axis=1)
        statistic += float(cells.sum())
        dof += int((np.maximum(windows_with_load - 1, 0) * np.maximum(ranks_with_load - 1, 0)).sum())
    return 1.0 if dof == 0 else max(1.0, statistic / dof)


__all__ = [
    "ACROSS_LAYER_STATS",
    "Imbalance",
    "across_layers",
    "balancedness",
    "count_replicas",
    "denoised_cv",
    "imbalance_cv",
    "max_over_mean",
    "pooled_rank_dispersion",
    "rank_dispersion",
    "rank_load",
    "sampling_noise_cv",
]
