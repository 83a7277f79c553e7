"""The production sizing advisor: forecast first, reactive when the forecast cannot be trusted.

Per policy, each tick:

- forecasting enabled, warm and reliable: the predictive advisor sizes the fleet for
  the forecast one lead time ahead (never below the current load and queue); the
  reactive advisor adds only *pressure* (a queue, a burning SLO, a p99 over its
  objective, a KV cache about to fill), so feedback still catches what the capacity
  model got wrong, but cannot hold the fleet up once the forecast says it may shrink;
- forecasting disabled (``forecast_disabled``), still warming up (``warming_up``) or
  unreliable (``forecast_unreliable``, its rolling WAPE or interval coverage past the
  policy's bounds): the reactive advisor alone sizes the fleet;
- a pressure-driven scale-up that bought nothing (:mod:`controller.scale_check`) holds
  further scale-ups for the same causes (``scale_ineffective``) until the signal changes,
  and gives its replicas back: while the held causes are all that keep the fleet up and
  the pressure looks like a tail no fleet size moves (p99s within twice their objectives,
  no queue of more than one request per ready replica; a backlog keeps p99s high until it
  drains, whatever the verdict said), it is sized as if they were not there (the load and
  the forecast still count), and back to the size the scale-up began at without waiting for
  the scale-down cooldown (``Advice.undo_to``).  An objective that no fleet size reaches (say
  long prompts whose prefill alone misses it on a slower replica than the profile says) then
  costs one scale-up per hold, not a fleet parked at ``max_replicas``.

This is the advisor ``moeslo controller serve``, ``moeslo up``, the replay and the
benchmarks all run (built by :func:`controller.builder.build_decision_core`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from controller.advisors import ReactiveAdvisor
from controller.entry_demand import waiting
from controller.feasibility import feasible_view, infeasible_share, prompt_length_tail
from controller.policy import Policy
from controller.predictive import Assessment, PredictiveAdvisor
from controller.scale_check import PRESSURE_REASONS, ScaleChecker, latency_ratio
from controller.types import Advice, LoadHistory, PolicyObservation, Reason, Scalar

__all__ = ["SizingAdvisor"]


GIVE_BACK_MAX_RATIO = 2.0
"""Worst p99 / objective up to which a held pressure may be a tail no fleet size moves; beyond it, a backlog."""


def _fleet_independent(policy: Policy, obs: PolicyObservation) -> bool:
    """Whether the pressure a held scale-up failed to relieve looks like a tail that no fleet size moves
    (prompts whose own prefill misses the objective, a slow dependency): p99s near their objectives and no
    queue of more than one request per ready replica.  A backlog (a queue, or p99s far past their
    objectives) is a fleet working through a burst, whatever the verdict said: nothing is given back."""
    ready = obs.ready_replicas if obs.ready_replicas is not None else obs.current_replicas or 0
    if waiting(obs) > max(ready, 1):
        return False
    ratio = latency_ratio(policy, obs)
    return ratio is None or ratio <= GIVE_BACK_MAX_RATIO


def _prefixed(prefix: str, details: Mapping[str, Scalar]) -> dict[str, Scalar]:
    return {f"{prefix}.{key}": value for key, value in details.items()}


class SizingAdvisor:
    """Forecast-first sizing with a reactive fallback and scale-up checks (see the module docstring)."""

    name = "sizing"

    def __init__(
        self, predictive: PredictiveAdvisor, reactive: ReactiveAdvisor, checker: ScaleChecker | None = None
    ) -> None:
        self.predictive = predictive
        self.reactive = reactive
        self.checker = checker or ScaleChecker()

    def warm_start(self, policy: Policy, history: LoadHistory) -> bool:
        return self.predictive.warm_start(policy, history)

    def refit(self) -> None:
        self.predictive.refit()

    def forget(self, policy_name: str) -> None:
        self.predictive.forget(policy_name)
        self.reactive.forget(policy_name)
        self.checker.forget(policy_name)

    def _feasible(
        self, policy: Policy, observation: PolicyObservation, details: dict[str, Scalar]
    ) -> PolicyObservation:
        """The observation with TTFT judged over the requests some fleet can serve (see controller.feasibility),
        after the capacity model has taken the hit rate and the prompt-length tail the engines report."""
        capacity = self.predictive.capacity(policy)
        if observation.prefix_cache_hit_rate is not None and math.isfinite(observation.prefix_cache_hit_rate):
            capacity.prefix_hit_rate = min(max(observation.prefix_cache_hit_rate, 0.0), 0.99)
        sli = observation.sli
        tail = None if sli is None else prompt_length_tail(sli.prompt_tokens_buckets)
        if tail is not None:
            capacity.observe_length_tail(*tail)
        if capacity.length_tail_observed:  # the tail sized for, from the last reading on
            details["prompt_cv2"] = round(capacity.targets.prompt_cv2, 3)
            details["prompt_p99_over_mean"] = round(capacity.targets.prompt_p99_over_mean, 3)
        share = None if sli is None else infeasible_share(sli.prompt_tokens_buckets, *capacity.infeasible_prompts())
        if share is not None:
            details["ttft_infeasible_share"] = round(share, 6)
        return feasible_view(observation, share)

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        # The scale-up check judges on what the fleet was seen to serve, every request counted: a p99 that the
        # feasible view hides whenever the infeasible share crosses P99_TAIL_SHARE would judge a scale-up's
        # before and after on different signals (TTFT then ITL alone) and call it effective.
        raw = observation
        self.predictive.catch_up(now_s)  # before the capacity model below reads (and may rebuild) its state
        sizing_details: dict[str, Scalar] = {}
        observation = self._feasible(policy, observation, sizing_details)
        reactive = self.reactive.advise(policy, observation, now_s)
        details = _prefixed("reactive", reactive.details) | sizing_details
        assessment = self.predictive.assess(policy, observation, now_s)
        if assessment is not None:
            details |= _prefixed("predictive", assessment.details)
        verdict = self.checker.observe(policy, raw, now_s, self.predictive.capacity(policy))
        if verdict is not None:
            details["scale_check"] = verdict
        need, reasons, calm = self._combine(policy, reactive, assessment)
        need, reasons, undo_to = self._hold_ineffective(policy, raw, now_s, need, reasons, calm, details)
        self.checker.note_advice(policy.name, need, reasons)
        view = None if assessment is None else assessment.forecast
        return Advice(
            replicas_needed=need,
            reasons=reasons,
            forecast_request_rate_rps=None if view is None else view.request_rate_rps,
            forecast_request_rate_upper_rps=None if view is None else view.sized_request_rate_rps,
            forecast_horizon_s=None if view is None else view.horizon_s,
            forecast=view,
            details=details,
            undo_to=undo_to,
        )

    @staticmethod
    def _combine(
        policy: Policy, reactive: Advice, assessment: Assessment | None
    ) -> tuple[int | None, tuple[str, ...], tuple[int, tuple[str, ...]] | None]:
        """The need and its reasons, from the forecast with reactive pressure, or from what is observed now;
        and the most any need without a pressure reason asks for (None: none does).

        Reactive sizing (no forecast, or one not to be trusted) takes the most of the reactive
        advice and the capacity model's need for the load and queue observed now: a scale-down
        needs both to agree, so neither KV usage alone nor a latency model alone shrinks the fleet.
        """
        if assessment is None:
            return reactive.replicas_needed, reactive.reasons, None
        needs: list[tuple[int, tuple[str, ...]]] = []
        status = assessment.forecast_status
        if not policy.forecast.enabled or status:
            marker = (Reason.FORECAST_DISABLED,) if not policy.forecast.enabled else status
            needs.extend((n, (r,)) for n, r in assessment.observed_needs)
            if reactive.replicas_needed is not None:
                needs.append((reactive.replicas_needed, reactive.reasons))
        else:
            marker = ()
            needs.extend((n, (r,)) for n, r in assessment.needs)
            pressure = any(r in PRESSURE_REASONS for r in reactive.reasons) or (
                Reason.SCALE_UP_PENDING in reactive.reasons
            )
            if pressure and reactive.replicas_needed is not None:
                needs.append((reactive.replicas_needed, reactive.reasons))
        need = max(n for n, _ in needs)
        reasons = tuple(dict.fromkeys(r for n, rs in needs if n == need for r in rs))
        calm_needs = [(n, rs) for n, rs in needs if not PRESSURE_REASONS.intersection(rs)]
        if not calm_needs:
            return need, (*reasons, *marker), None
        most = max(n for n, _ in calm_needs)
        calm_reasons = tuple(dict.fromkeys(r for n, rs in calm_needs if n == most for r in rs))
        return need, (*reasons, *marker), (most, calm_reasons)

    def _hold_ineffective(
        self,
        policy: Policy,
        obs: PolicyObservation,
        now_s: float,
        need: int | None,
        reasons: tuple[str, ...],
        calm: tuple[int, tuple[str, ...]] | None,
        details: dict[str, Scalar],
    ) -> tuple[int | None, tuple[str, ...], int | None]:
        """Scale-ups for a cause that just proved ineffective are held until the signal changes, and while that
        cause is all that keeps the fleet at its size, the fleet is sized for ``calm`` (the needs without it).

        ``obs`` is the observation as observed, as the verdict judged it: with a long-prompt tail's p99 set aside,
        a backlog's p99s (many times their objectives) would pass for a tail that no fleet moves."""
        current = obs.current_replicas
        if need is None or current is None or need < current:
            return need, reasons, None
        held = self.checker.held(policy, obs, now_s)
        if held is None:
            return need, reasons, None
        causes = {r for r in reasons if r in PRESSURE_REASONS}
        if not causes or not causes <= held.causes:
            return need, reasons, None  # a new cause (or a forecast) asks for this scale-up
        details["scale_check"] = held.detail
        if calm is not None and calm[0] > current:
            # The load or the forecast asks for more than the fleet has: that is not the held cause.  No pressure
            # reason goes with it, so the step is not judged as another pressure scale-up and the hold stays.
            return calm[0], (*calm[1], Reason.SCALE_INEFFECTIVE), None
        if calm is not None and calm[0] < current and _fleet_independent(policy, obs):
            # What the ineffective scale-up added buys nothing: give it back, down to what the load needs; at once
            # down to the size before it, unless the fleet has moved since (then the guards judge the step).
            undo_to = held.before if current == held.after else None
            return calm[0], (*calm[1], *sorted(causes), Reason.SCALE_INEFFECTIVE), undo_to
        kept = tuple(r for r in reasons if r not in PRESSURE_REASONS and r != Reason.SCALE_UP_PENDING)
        return current, (*kept, *sorted(causes), Reason.SCALE_INEFFECTIVE), None
