"""Out-of-sample scoring: how a placement does on load it was not planned from.

A placement is always applied to the *next* window, so its balance on the
window it was planned from says little.  :func:`score_placement` measures a
placement on any load (max/mean and CV per layer, averaged over the layers with
load and worst layer); :func:`leave_one_out` plans on every window but one and
scores on the one left out, for each in turn; :func:`ordered_pairs` plans on one
window and scores on another.  :func:`held_out_gain` is what the live trigger
predicts: a plan made without the latest window, against the current placement,
both on that latest window, with the window's sampling noise taken out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.imbalance import Imbalance, denoised_cv, rank_load, sampling_noise_cv
from controller.rebalance.packing import FloatArray, IntArray

Planner = Callable[[Sequence[FloatArray]], IntArray]
"""Windows (each layers x experts, oldest first) in, ``phy2log`` (layers x slots) out."""


@dataclass(frozen=True, kw_only=True)
class PlacementScore:
    """A placement's imbalance on one load, over the layers that carry load."""

    max_over_mean_avg: float
    max_over_mean_worst: float
    cv_avg: float
    cv_worst: float

    def to_json(self) -> dict[str, float]:
        return dict(self.__dict__)


def score_placement(phy2log: npt.ArrayLike, load: npt.ArrayLike, num_ranks: int) -> PlacementScore:
    """Max/mean and CV of per-rank load when ``load`` is routed through ``phy2log`` (replicas split evenly)."""
    p2l = np.asarray(phy2log, dtype=np.int64)
    matrix = np.asarray(load, dtype=np.float64)
    active = matrix.sum(axis=1) > 0
    summary = Imbalance.of(rank_load(p2l, matrix, num_ranks)).summary(active)
    return PlacementScore(
        max_over_mean_avg=summary["max_over_mean_avg"],
        max_over_mean_worst=summary["max_over_mean_worst"],
        cv_avg=summary["cv_avg"],
        cv_worst=summary["cv_worst"],
    )


def leave_one_out(windows: Mapping[str, FloatArray], plan: Planner, num_ranks: int) -> dict[str, PlacementScore]:
    """For each window: plan on all the others (in the mapping's order), score on it."""
    names = list(windows)
    out: dict[str, PlacementScore] = {}
    for name in names:
        others = [windows[n] for n in names if n != name]
        out[name] = score_placement(plan(others), windows[name], num_ranks)
    return out


def ordered_pairs(
    windows: Mapping[str, FloatArray], plan: Planner, num_ranks: int
) -> dict[tuple[str, str], PlacementScore]:
    """For each ordered pair ``(a, b)`` of different windows: plan on ``a`` alone, score on ``b``."""
    out: dict[tuple[str, str], PlacementScore] = {}
    for a, load_a in windows.items():
        phy2log = plan([load_a])
        for b, load_b in windows.items():
            if a != b:
                out[(a, b)] = score_placement(phy2log, load_b, num_ranks)
    return out


@dataclass(frozen=True, kw_only=True)
class HeldOutGain:
    """Per layer, on a window the plan did not see: the CV of the current placement and of the plan.

    Both are denoised (the window's sampling noise taken out), so they estimate what the
    routing itself does; ``noise_cv`` is that noise for the plan's placement, ``noise_before``
    for the current one.  Denoising removes the noise's mean, not its spread: see :meth:`gain_spread`.
    """

    cv_before: FloatArray
    cv_after: FloatArray
    noise_cv: FloatArray
    active: npt.NDArray[np.bool_]
    noise_before: FloatArray

    def gain_spread(self) -> FloatArray:
        """Per layer, the sampling spread (one standard deviation) of ``cv_before - cv_after``.

        To first order a denoised CV moves with the rank shares' sampling error along a single
        direction, while its noise floor sums that error over all R - 1 free directions: its spread
        is at most its ``noise`` (equal on 2 ranks, about ``noise / sqrt(R - 1)`` near balance).
        The gain subtracts two such CVs of one window, taken here as independent:
        ``sqrt(noise_before^2 + noise_after^2)``.  Simulated zero-gain plans (2 to 8 ranks, skewed
        and even loads, 160 to 10,240 assignments) scattered 0.2 to 1.0 times this.
        """
        return np.sqrt(self.noise_before**2 + self.noise_cv**2)

    @property
    def worst_spread(self) -> float:
        """The largest :meth:`gain_spread` over the layers with load."""
        return float(self.gain_spread()[self.active].max()) if self.active.any() else 0.0

    @property
    def worst_noise(self) -> float:
        """The largest noise floor of either placement over the layers with load."""
        if not self.active.any():
            return 0.0
        return float(np.maximum(self.noise_before, self.noise_cv)[self.active].max())

    @property
    def worst_before(self) -> float:
        return float(self.cv_before[self.active].max()) if self.active.any() else 0.0

    @property
    def worst_after(self) -> float:
        return float(self.cv_after[self.active].max()) if self.active.any() else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"worst_cv_before": self.worst_before, "worst_cv_after": self.worst_after,
                "cv_before": self.cv_before.tolist(), "cv_after": self.cv_after.tolist(),
                "noise_cv": self.noise_cv.tolist(), "noise_before": self.noise_before.tolist()}


def held_out_gain(current: IntArray, planned: IntArray, window: npt.ArrayLike, num_ranks: int) -> HeldOutGain:
    """Score ``current`` and ``planned`` (phy2log) on ``window`` (token counts, layers x experts)."""
    counts = np.asarray(window, dtype=np.float64)
    assignments = counts.sum(axis=1)
    out: dict[str, FloatArray] = {}
    noise: dict[str, FloatArray] = {}
    for key, phy2log in (("before", current), ("after", planned)):
        load = rank_load(phy2log, counts, num_ranks)
        noise[key] = sampling_noise_cv(assignments, num_ranks, load)
        out[key] = denoised_cv(Imbalance.of(load).cv, np.where(np.isfinite(noise[key]), noise[key], 0.0))
    return HeldOutGain(cv_before=out["before"], cv_after=out["after"], noise_cv=noise["after"],
                       noise_before=noise["before"], active=assignments > 0)  # fmt: skip


__all__ = [
    "HeldOutGain",
    "PlacementScore",
    "Planner",
    "held_out_gain",
    "leave_one_out",
    "ordered_pairs",
    "score_placement",
]
