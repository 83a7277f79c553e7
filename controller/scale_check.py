"""Scale-ups checked against what they were meant to buy.

A scale-up made under pressure (a queue, a burning SLO, a p99 over its objective,
a KV cache about to fill) is meant to relieve it.  Once the new replicas are
ready and have had ``settle_s`` to take load, the checker compares the fleet with
what the capacity model predicted: the worst p99 / objective ratio should drop by
at least ``min_gain`` of the predicted drop (and more than a p99's noise,
``noise_gain``), or the served throughput should grow
by at least ``min_gain`` of the added capacity while a queue was waiting.  A
scale-up that bought neither is *ineffective* (``scale_ineffective``): the CPUs
were oversubscribed, a shared dependency is the bottleneck, or the load is not
what the fleet can fix.  A further step up the advisor asked for (pressure, load or
forecast) before a scale-up is judged joins it: the chain is judged once, from its first
size and the p99 seen at its first step (with start-ups longer than the advisor's steps,
judging each step alone judged none); any other change ends it unjudged.  More replicas
for the same causes are then held until the signal changes: the offered load
(smoothed) moves by ``load_change``, the pressure goes away, the replica count is
changed by someone else, or ``hold_s`` passes.  (The sizing advisor meanwhile gives
the ineffective replicas back, and still adds what the load or the forecast alone asks
for; neither step ends the hold.)

Pure: observations and time in, verdicts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.capacity import CapacityModel, Load
from controller.entry_demand import offered_load, router_refused, waiting
from controller.policy import Policy
from controller.types import PolicyObservation, Reason

__all__ = ["PRESSURE_REASONS", "HeldCause", "ScaleCheckConfig", "ScaleChecker", "latency_ratio"]

PRESSURE_REASONS = frozenset({
    Reason.QUEUE_DEPTH, Reason.ROUTER_QUEUE, Reason.ROUTER_REFUSED, Reason.SLO_BURN, Reason.LATENCY_P99,
    Reason.HIGH_UTILIZATION,
})
"""Reasons that say the fleet is short *now* (as opposed to a forecast of later need)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleCheckConfig:
    settle_s: float = 60.0
    """Time the new replicas get, once ready, before their effect is judged."""
    min_gain: float = 0.25
    """Share of the predicted improvement that must show for a scale-up to count as effective."""
    noise_gain: float = 0.05
    """Drop of the worst p99/objective that any scale-up must show, whatever was predicted: a smaller one is
    within a p99's sampling noise, so a scale-up the model itself expected little of cannot pass on it."""
    hold_s: float = 1800.0
    """Longest a cause stays held without any change in the signal."""
    load_change: float = 0.25
    """Relative change of the offered request rate that re-arms a held cause."""
    load_smoothing_s: float = 180.0
    """Time constant of the smoothed offered rate that ``load_change`` is judged on: a one-minute swing of a
    bursty trace is not a change of load (a load that does grow is sized for meanwhile: only pressure is held)."""
    ready_timeout_s: float = 900.0
    """A scale-up whose replicas are not ready by then is not judged (start-up failures are another story)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HeldCause:
    causes: frozenset[str]
    since_s: float
    request_rate_rps: float
    replicas: int
    before: int
    after: int
    """The sizes before and after the scale-up (chain) that bought nothing: from ``after`` (and nothing else
    having changed the fleet since), giving it back may return to ``before`` at once."""
    detail: str


@dataclass(kw_only=True, slots=True)
class _Pending:
    before: int
    after: int
    pressed_to: int
    """The size the chain's steps for pressure reached: what the throughput test expects capacity from (replicas
    a later step added for the forecast have no demand waiting for them)."""
    causes: frozenset[str]
    started_s: float
    ready_s: float | None
    p99s_before: tuple[float | None, float | None]
    """(TTFT, ITL) p99 at the chain's first step: judged against the objectives in force at the verdict, as the p99s
    after it are (an objective changed in between must not decide the verdict)."""
    served_before: float | None
    queue_before: float
    refused_before: float
    """Requests/s the entry router refused: like a queue, demand the added replicas should now serve."""
    predicted_gain: float
    """Predicted relative drop of the worst latency ratio, in [0, 1]."""


@dataclass(kw_only=True, slots=True)
class _PolicyChecks:
    last_current: int | None = None
    last_need: int | None = None
    last_causes: frozenset[str] = frozenset()
    pending: _Pending | None = None
    held: HeldCause | None = None
    verdicts: int = 0
    smoothed_rate: float | None = None
    """The offered request rate, smoothed over ``load_smoothing_s``."""
    smoothed_at_s: float | None = None


def latency_ratio(policy: Policy, obs: PolicyObservation) -> float | None:
    """The worst p99 / objective of TTFT and ITL (None: no p99 observed)."""
    return _worst_ratio(policy, _p99s(obs))


def _p99s(obs: PolicyObservation) -> tuple[float | None, float | None]:
    """The observed (TTFT, ITL) p99s."""
    sli = obs.sli
    return (None, None) if sli is None else (sli.ttft_p99_s, sli.itl_p99_s)


def _worst_ratio(policy: Policy, p99s: tuple[float | None, float | None]) -> float | None:
    """The worst of the (TTFT, ITL) p99s over the policy's objectives (None: neither known)."""
    objectives = (policy.objectives.ttft, policy.objectives.itl)
    ratios = [p99 / objective.threshold_s for p99, objective in zip(p99s, objectives, strict=True)
              if p99 is not None and math.isfinite(p99)]  # fmt: skip
    return max(ratios) if ratios else None


def _predicted_gain(capacity: CapacityModel, load: Load | None, before: int, after: int) -> float:
    """Relative drop of the worst p99 ratio the capacity model predicts from ``before`` to ``after`` replicas."""
    if load is None or load.request_rate_rps <= 0 or before <= 0:
        return 1.0
    was, will = capacity.predict(load, before), capacity.predict(load, after)
    if not was.stable:
        return 1.0
    t = capacity.targets
    ratio_was = max(was.ttft_p99_s / t.ttft_s, was.itl_p99_s / t.itl_s)
    ratio_will = max(will.ttft_p99_s / t.ttft_s, will.itl_p99_s / t.itl_s)
    return min(1.0, max(0.0, 1.0 - ratio_will / ratio_was)) if ratio_was > 0 else 0.0


def _extended(
    chain: _Pending, current: int, causes: frozenset[str], now_s: float, capacity: CapacityModel,
    obs: PolicyObservation,
) -> _Pending:
    """A further step up before ``chain`` was judged: judged together, from the chain's first size and the
    p99 seen at its first step (the p99 seen now is partly the chain's own earlier steps')."""
    return replace(
        chain, after=current, pressed_to=current if causes else chain.pressed_to, causes=chain.causes | causes,
        started_s=now_s, ready_s=None,
        predicted_gain=_predicted_gain(capacity, offered_load(obs), chain.before, current),
    )


class ScaleChecker:
    """Per policy: notices scale-ups taking effect, judges them, and holds causes that did not pay."""

    def __init__(self, config: ScaleCheckConfig | None = None) -> None:
        self.config = config or ScaleCheckConfig()
        self._state: dict[str, _PolicyChecks] = {}

    def forget(self, policy_name: str) -> None:
        self._state.pop(policy_name, None)

    def observe(
        self, policy: Policy, obs: PolicyObservation, now_s: float, capacity: CapacityModel
    ) -> str | None:
        """Update with this tick's observation; returns a verdict line when a scale-up was judged now."""
        state = self._state.setdefault(policy.name, _PolicyChecks())
        self._smooth_rate(state, obs, now_s)
        current = obs.current_replicas
        previous, state.last_current = state.last_current, current
        if current is None:
            return None
        if previous is not None and current != previous:
            chain, state.pending = state.pending, None
            if state.held is not None and current != state.held.replicas:
                # A step towards what was advised, down (the ineffective scale-up given back) or up for the load or
                # the forecast alone (no pressure cause), leaves the cause held.  Any other change (someone else's,
                # or a scale-up for pressure) makes the held signal stale.
                asked = state.last_need
                advised = asked is not None and (
                    asked <= current < previous or (not state.last_causes and previous < current <= asked))
                state.held = replace(state.held, replicas=current) if advised else None
            need = state.last_need or 0
            ours = current > previous and need >= current
            if ours and chain is not None and chain.after == previous:
                state.pending = _extended(chain, current, state.last_causes, now_s, capacity, obs)
            elif ours and state.last_causes:
                state.pending = _Pending(
                    before=previous, after=current, pressed_to=current, causes=state.last_causes, started_s=now_s,
                    ready_s=None,
                    p99s_before=_p99s(obs), served_before=obs.output_tokens_per_s,
                    queue_before=waiting(obs), refused_before=router_refused(obs),
                    predicted_gain=_predicted_gain(capacity, offered_load(obs), previous, current),
                )
        return self._judge(policy, obs, now_s, state)

    def _smooth_rate(self, state: _PolicyChecks, obs: PolicyObservation, now_s: float) -> None:
        offered = offered_load(obs)  # a scale-up that ends refusals moves load from refused to served: no change
        if offered is None:
            return
        rate = offered.request_rate_rps
        if state.smoothed_rate is None or state.smoothed_at_s is None:
            state.smoothed_rate = rate
        else:
            weight = 1.0 - math.exp(-max(now_s - state.smoothed_at_s, 0.0) / max(self.config.load_smoothing_s, 1e-9))
            state.smoothed_rate += weight * (rate - state.smoothed_rate)
        state.smoothed_at_s = now_s

    def _judge(self, policy: Policy, obs: PolicyObservation, now_s: float, state: _PolicyChecks) -> str | None:
        pending = state.pending
        if pending is None:
            return None
        cfg = self.config
        if pending.ready_s is None:
            if obs.ready_replicas is not None and obs.ready_replicas >= pending.after:
                pending.ready_s = now_s
            elif now_s - pending.started_s > cfg.ready_timeout_s:
                state.pending = None
            return None
        if now_s - pending.ready_s < cfg.settle_s:
            return None
        state.pending = None
        state.verdicts += 1
        effective, detail = self._effective(policy, obs, pending)
        if effective:
            return f"scale-up {pending.before} -> {pending.after} effective: {detail}"
        state.held = HeldCause(
            causes=pending.causes, since_s=now_s, request_rate_rps=state.smoothed_rate or 0.0,
            replicas=pending.after, before=pending.before, after=pending.after,
            detail=f"scale-up {pending.before} -> {pending.after} bought nothing: {detail}",
        )
        return state.held.detail

    def _effective(self, policy: Policy, obs: PolicyObservation, pending: _Pending) -> tuple[bool, str]:
        gain_needed = self.config.min_gain
        ratio_now, ratio_before = latency_ratio(policy, obs), _worst_ratio(policy, pending.p99s_before)
        parts = []
        if ratio_now is not None and ratio_now <= 1.0:
            return True, f"p99 within the objectives (worst p99/objective {ratio_now:.2f})"
        if ratio_now is not None and ratio_before is not None and ratio_before > 0:
            gain = 1.0 - ratio_now / ratio_before
            parts.append(f"worst p99/objective {ratio_before:.2f} -> {ratio_now:.2f} "
                         f"({gain:+.0%}, predicted {pending.predicted_gain:+.0%})")
            if gain >= max(gain_needed * pending.predicted_gain, self.config.noise_gain):
                return True, "; ".join(parts)
        if pending.refused_before > 0 and obs.router_refused_rps == 0:
            return True, f"the entry router no longer refuses (was {pending.refused_before:.2f} req/s)"
        served_now = obs.output_tokens_per_s
        pressed = pending.queue_before > 0 or pending.refused_before > 0
        if pressed and served_now is not None and pending.served_before:
            growth = served_now / pending.served_before - 1.0
            expected = pending.pressed_to / max(pending.before, 1) - 1.0
            parts.append(f"served output tokens/s {pending.served_before:.0f} -> {served_now:.0f} "
                         f"({growth:+.0%}, capacity added for pressure {expected:+.0%})")
            if growth >= gain_needed * expected:
                return True, "; ".join(parts)
        if not parts:
            return True, "no latency or throughput signal to judge by"
        return False, "; ".join(parts)

    def note_advice(self, policy_name: str, need: int | None, reasons: tuple[str, ...]) -> None:
        """What the advisor asked for this tick (a later rise of the replica count is judged against it)."""
        state = self._state.setdefault(policy_name, _PolicyChecks())
        state.last_need = need
        state.last_causes = frozenset(r for r in reasons if r in PRESSURE_REASONS)

    def held(self, policy: Policy, obs: PolicyObservation, now_s: float) -> HeldCause | None:
        """The cause held now, if the signal has not changed since it was held."""
        state = self._state.get(policy.name)
        if state is None or state.held is None:
            return None
        held = state.held
        rate = state.smoothed_rate
        ratio = latency_ratio(policy, obs)
        changed = (
            now_s - held.since_s > self.config.hold_s
            or (rate is not None and abs(rate - held.request_rate_rps) > self.config.load_change * max(
                held.request_rate_rps, 1e-9))
            or (ratio is not None and ratio <= 1.0 and not waiting(obs) > 0)
        )
        if changed:
            state.held = None
            return None
        return held
