"""When to apply a rebalance plan, and whether it worked: pure functions of time and observations.

:func:`decide_rebalance` rebalances only when the policy's imbalance objective
(worst layer's CV above ``max_cv``) has been violated for ``sustain_s``, the
cooldown since the last rebalance has passed, and the candidate plan improves
the predicted worst-layer CV by at least ``margin`` (a held-out gain by
``GAIN_SIGMAS`` of its sampling spreads more).  Checks run in that order and the
first that fails is the reason::

    no_observations -> imbalance_ok -> not_sustained -> cooldown -> insufficient_traffic
        -> insufficient_improvement -> rebalance

:func:`verify_rebalance` compares the CV measured after applying a plan with
the plan's prediction.  Time comes in as ``now_s`` (any monotonic clock), so a
replay clock works.  Whether to apply (enforce) or only log (advisory) is the
caller's business: the decision is the same.

Both account for sampling noise.  A CV measured over a window of N routed
assignments is inflated by chance alone (:func:`contracts.imbalance.sampling_noise_cv`:
a perfectly balanced placement measures ``sqrt((R - 1) / N)`` on R ranks), so
the trigger judges the *denoised* CV of each layer against the objective, and
verification expects ``sqrt(predicted^2 + noise^2)`` and allows ``NOISE_SIGMAS``
noise widths on top of it.  A short, quiet window neither triggers a rebalance
nor fails one; a window too short to tell a met objective from a missed one
is ``insufficient_traffic`` and is measured again later.  The held-out gain the
trigger judges is a difference of two denoised CVs of one window: denoising
removes the noise's mean, not its spread, so the gain must clear its spread too,
and a held-out window too short to judge it (either placement's noise above
half the objective, as in verification) is ``insufficient_traffic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from contracts.errors import ValidationError
from contracts.imbalance import denoised_cv, sampling_noise_cv
from contracts.placement import Placement
from contracts.slo_defaults import SCALE_DOWN_COOLDOWN_S
from controller.policy import ImbalanceObjective
from controller.rebalance.out_of_sample import HeldOutGain
from controller.rebalance.planner import RebalancePlan

TriggerReason = Literal[
    "no_observations", "imbalance_ok", "not_sustained", "cooldown", "insufficient_traffic",
    "insufficient_improvement", "rebalance",
]
VerifyReason = Literal[
    "verified", "worse_than_predicted", "still_violating", "no_observations", "insufficient_traffic", "superseded"
]

NOISE_SIGMAS = 3.0
"""Noise widths a measured CV may exceed its expectation by before a plan counts as not working
(for one layer on two ranks, chance exceeds it 0.3 % of the time)."""

GAIN_SIGMAS = 2.33
"""Spreads (:meth:`HeldOutGain.gain_spread`) a held-out gain must clear on top of the margin: a normal
variable exceeds 2.33 standard deviations 1 % of the time, and the spread overestimates the gain's, so a
plan that gains nothing triggers on at most about 1 % of the tests (simulated, 2 to 8 ranks, 2,000 tests
each: 0.1 % at most from 640 assignments a layer up, 1.4 % at 160 on 2 ranks, a window ``max_cv`` 0.15
calls ``insufficient_traffic``; the flat margin alone triggered on 0.3 % to 43 %)."""


@dataclass(frozen=True)
class CvObservation:
    """Per-layer CV of per-rank expert load, measured over a window ending at ``now_s``.

    ``noise_cv`` is each layer's sampling-noise floor for the window's assignments
    (all zero when unknown: the CV is then taken at face value).
    """

    now_s: float
    cv: tuple[float, ...]
    noise_cv: tuple[float, ...] = ()

    @classmethod
    def of(cls, now_s: float, cv: npt.ArrayLike, noise_cv: npt.ArrayLike | None = None) -> CvObservation:
        values = tuple(float(x) for x in np.asarray(cv, dtype=np.float64).ravel())
        noise = () if noise_cv is None else tuple(float(x) for x in np.asarray(noise_cv, dtype=np.float64).ravel())
        return cls(float(now_s), values, noise)

    @property
    def worst_cv(self) -> float:
        return max(self.cv, default=0.0)

    @property
    def worst_denoised_cv(self) -> float:
        """The worst layer's CV with its sampling noise taken out (what the objective is judged on)."""
        if not self.noise_cv:
            return self.worst_cv
        return float(np.max(denoised_cv(self.cv, self.noise_cv), initial=0.0))


@dataclass(frozen=True, kw_only=True)
class TriggerSettings:
    """How eager the trigger is; defaults are the mission's (cooldown as for scale-down)."""

    cooldown_s: float = float(SCALE_DOWN_COOLDOWN_S)
    margin: float = 0.02
    """Smallest drop of the predicted worst-layer CV that justifies moving weights."""
    max_gap_s: float = 120.0
    """Observations further apart than this and than the objective's ``sustain_s`` end a run of violations: the
    engine was idle (too few steps to judge) or out of reach in between, so nothing shows that the imbalance
    held, and one busy window after an idle hour is not ``sustain_s`` of it."""


@dataclass(frozen=True, kw_only=True)
class RebalanceDecision:
    """What to do now and why; every figure a dashboard or decision log needs."""

    action: Literal["rebalance", "hold"]
    reason: TriggerReason
    now_s: float
    worst_cv: float | None
    """Worst layer's CV in the latest observation."""
    worst_denoised_cv: float | None
    """The same with each layer's sampling noise taken out (what is compared with ``max_cv``)."""
    max_cv: float
    violating_since_s: float | None
    """Start of the current unbroken run of violating observations."""
    cooldown_left_s: float
    predicted_cv_before: float | None
    """Worst layer's CV of the current placement under the plan's load (or the held-out window)."""
    predicted_cv_after: float | None
    prediction: Literal["in_sample", "held_out"] = "in_sample"
    """Where the predicted CVs come from: the load the plan was made from, or the latest window,
    which a plan made without it is scored on (denoised); the second is what the next window will see."""
    required_gain: float | None = None
    """The drop of the predicted worst-layer CV a rebalance needs: the margin, plus ``GAIN_SIGMAS``
    sampling spreads of a held-out gain (None: no plan)."""
    held_out_noise_cv: float | None = None
    """The held-out window's largest noise floor (None: in-sample); above half ``max_cv`` it is
    ``insufficient_traffic``."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def decide_rebalance(
    *,
    objective: ImbalanceObjective,
    history: Sequence[CvObservation],
    now_s: float,
    last_rebalance_s: float | None,
    plan: RebalancePlan | None,
    settings: TriggerSettings | None = None,
    held_out: HeldOutGain | None = None,
) -> RebalanceDecision:
    """Rebalance or hold.  ``history`` is in time order; ``plan`` is the candidate for the current load.

    With ``held_out`` (a plan made without the latest window, and the current placement, both
    scored on that window) the gain is judged out of sample: its CVs replace the plan's own.
    """
    settings = settings or TriggerSettings()
    seen = [obs for obs in history if obs.now_s <= now_s]
    cooldown_left = 0.0
    if last_rebalance_s is not None:
        cooldown_left = max(0.0, last_rebalance_s + settings.cooldown_s - now_s)
    held_out = held_out if plan is not None else None
    before, after, required = _predicted_gain(plan, held_out, settings.margin)

    def decision(reason: TriggerReason, worst: float | None, since: float | None) -> RebalanceDecision:
        return RebalanceDecision(
            action="rebalance" if reason == "rebalance" else "hold",
            reason=reason,
            now_s=now_s,
            worst_cv=worst,
            worst_denoised_cv=seen[-1].worst_denoised_cv if seen else None,
            max_cv=objective.max_cv,
            violating_since_s=since,
            cooldown_left_s=cooldown_left,
            predicted_cv_before=before,
            predicted_cv_after=after,
            prediction="held_out" if held_out is not None else "in_sample",
            required_gain=required,
            held_out_noise_cv=held_out.worst_noise if held_out is not None else None,
        )

    if not seen:
        return decision("no_observations", None, None)
    worst = seen[-1].worst_cv
    since = _violating_since(seen, objective.max_cv, max(settings.max_gap_s, objective.sustain_s))
    if since is None:
        return decision("imbalance_ok", worst, None)
    if now_s - since < objective.sustain_s:
        return decision("not_sustained", worst, since)
    if cooldown_left > 0:
        return decision("cooldown", worst, since)
    if held_out is not None and held_out.worst_noise > objective.max_cv / 2:
        return decision("insufficient_traffic", worst, since)
    if before is None or after is None or required is None or before - after < required:
        return decision("insufficient_improvement", worst, since)
    return decision("rebalance", worst, since)


def _predicted_gain(
    plan: RebalancePlan | None, held_out: HeldOutGain | None, margin: float
) -> tuple[float | None, float | None, float | None]:
    """Worst-layer CV before and after, and the drop a rebalance needs (all None without a plan's gain).

    A held-out gain is measured on one window and scatters with its sampling noise (a plan that gains
    nothing measured gains above 0.02 a quarter of the time on 640 assignments): it must clear the margin
    by ``GAIN_SIGMAS`` of its spread.  An in-sample gain is the plan's own arithmetic, without noise.
    """
    if plan is not None and held_out is not None:
        return held_out.worst_before, held_out.worst_after, margin + GAIN_SIGMAS * held_out.worst_spread
    if plan is not None and plan.active.any():
        before = float(plan.imbalance_before.cv[plan.active].max())
        return before, float(plan.imbalance_after.cv[plan.active].max()), margin
    return None, None, None


def _violating_since(history: Sequence[CvObservation], max_cv: float, max_gap_s: float) -> float | None:
    """Time of the first observation of the latest unbroken run above ``max_cv`` (None: latest is fine); a gap
    over ``max_gap_s`` between two observations breaks the run."""
    since = None
    for obs in reversed(history):
        if obs.worst_denoised_cv <= max_cv or (since is not None and since - obs.now_s > max_gap_s):
            break
        since = obs.now_s
    return since


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """How the measured imbalance after a rebalance compares with the plan's prediction."""

    ok: bool
    reason: VerifyReason
    measured_cv: float | None
    """Worst layer's CV measured after the rebalance."""
    predicted_cv: float
    measured_minus_predicted: float | None
    """The most any layer's measured CV exceeds what it should measure: its prediction with the
    sampling noise of the window (``sqrt(predicted^2 + noise^2)``)."""
    noise_cv: float | None = None
    """The worst layer's sampling-noise floor over the window (None: unknown, taken as 0)."""
    denoised_cv: float | None = None
    """The worst layer's measured CV with its noise taken out."""
    noise_dispersion: float = 1.0
    """How many times the independent-draw variance the noise was taken as (:func:`rank_dispersion`)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def verify_rebalance(
    *,
    plan: RebalancePlan,
    measured_cv: npt.ArrayLike | None,
    objective: ImbalanceObjective,
    assignments: npt.ArrayLike | None = None,
    tolerance: float = 0.05,
    predicted_cv: npt.ArrayLike | None = None,
    dispersion: float = 1.0,
    placement_in_use: Placement | None = None,
) -> VerifyResult:
    """Check the per-layer CV measured after applying ``plan`` over a window of ``assignments`` per layer.

    ``worse_than_predicted``: some layer's measured CV exceeds its noisy expectation by more
    than ``tolerance`` plus ``NOISE_SIGMAS`` noise widths (routing drifted, or the plan was not
    applied); ``still_violating``: within the prediction but, noise taken out, above the objective
    (the best a plan could do under that load); ``insufficient_traffic``: the window is too small
    to tell (the noise alone is half the objective); ``verified`` otherwise.  Without
    ``assignments`` the noise is taken as 0.  ``predicted_cv`` (per layer, noise-free) replaces
    the plan's own prediction, e.g. its out-of-sample one (:class:`HeldOutGain`'s ``cv_after``).
    ``dispersion`` (:func:`contracts.imbalance.rank_dispersion` over the engine's recent windows)
    widens the noise where routed assignments are not independent draws.  ``superseded``: the engine runs
    ``placement_in_use``, not the plan's (restarted, or vLLM's own EPLB): its CV says nothing of the plan."""
    predicted = plan.imbalance_after.cv if predicted_cv is None else np.asarray(predicted_cv, dtype=np.float64)
    active = plan.active
    predicted_worst = float(predicted[active].max()) if active.any() else 0.0
    superseded = placement_in_use is not None and placement_in_use != plan.placement
    if superseded or measured_cv is None:
        return VerifyResult(ok=False, reason="superseded" if superseded else "no_observations", measured_cv=None,
                            predicted_cv=predicted_worst, measured_minus_predicted=None)  # fmt: skip
    measured = np.asarray(measured_cv, dtype=np.float64).ravel()
    if measured.shape != predicted.shape:
        raise ValidationError(f"measured CV has {measured.size} layers, the plan has {predicted.size}")
    noise = np.zeros_like(measured)
    if assignments is not None:
        noise = sampling_noise_cv(assignments, plan.placement.num_ranks, plan.rank_load) * np.sqrt(max(dispersion, 1.0))
    if not active.any():
        return VerifyResult(ok=True, reason="verified", measured_cv=0.0, predicted_cv=0.0, measured_minus_predicted=0.0)
    expected = np.sqrt(predicted * predicted + noise * noise)
    gap = float((measured - expected)[active].max())
    excess = float((measured - expected - NOISE_SIGMAS * noise)[active].max())
    clean = denoised_cv(measured, noise)
    worst_noise = float(noise[active].max())
    reason: VerifyReason
    if excess > tolerance:
        reason = "worse_than_predicted"
    elif worst_noise > objective.max_cv / 2:
        reason = "insufficient_traffic"
    elif float(clean[active].max()) > objective.max_cv:
        reason = "still_violating"
    else:
        reason = "verified"
    return VerifyResult(
        ok=reason == "verified", reason=reason, measured_cv=float(measured[active].max()),
        predicted_cv=predicted_worst, measured_minus_predicted=gap,
        noise_cv=worst_noise if assignments is not None else None, denoised_cv=float(clean[active].max()),
        noise_dispersion=max(dispersion, 1.0),
    )
