"""The decision core: one tick turns policies and observations into decisions with reasons.

Zero I/O: time comes in as ``TickInput.now_s``, observations come in as data,
decisions go out as data.  The core never learns where the observations came
from or who carries out its decisions, so production, the trace replay and the
tests all drive this same class.

Per policy, in order (the first guardrail that holds ends the evaluation)::

    mode off                          -> hold  [mode_off]
    no observation / no replica count -> hold  [insufficient_data]
    (NaN, infinite, negative or out-of-range values count as unknown)
    observation from the future (beyond clock_skew_tolerance_s)
                                      -> hold  [clock_skew]
    observation older than stale_after_s, or no advisor has an opinion:
      replicas outside [min_replicas, max_replicas]
                                      -> move toward the bound, at most max_step
                                         [stale_data / insufficient_data, below_min / above_max]
      otherwise                       -> hold  [stale_data / insufficient_data]
    need = max over advisors (reasons of each)
    the rules about zero (controller.entry_demand): requests at the entry
      router wake a fleet at zero [router_queue]; the need goes to zero only
      with min_replicas 0 and an idle router in view [router_idle], else >= 1
    clamp need to [min_replicas, max_replicas]           [at_min / at_max]
    no more replicas than the actuator has room for      [host_budget]
    want fewer replicas, but the source reported errors -> hold [partial_data]
    want fewer replicas inside the cooldown since the last change
                                      -> hold  [cooldown]
    want fewer replicas than were needed at any time within the cooldown
                                      -> no lower than that  [stabilization]
    want fewer than current / max_scale_down_rate (not zero)
                                      -> no lower than that  [scale_down_rate]
      (none of them holds back an advisor's ``undo_to``, nor is cited when it goes
      past them: a scale-up it judged ineffective goes back to the size it began at)
    move at most max_step replicas                       [max_step]
    mode advisory / read-only target  -> decided, apply=False [mode_advisory / read_only_target]

So a metrics outage (no data, stale data, or a source that failed) can never
shrink a fleet, let alone scale it to zero -- except back down to max_replicas,
which is the policy's own rule and needs no data.  And a fleet below
min_replicas (at zero it has no engines, hence no metrics) is brought back to
the bound without waiting for data.

The only state is plain data per policy (:class:`PolicyState`): when replicas
last changed and the last decision, so a restarted controller can carry it over.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.advisors import ReactiveAdvisor
from controller.bounds import bound_first, clamp_to_bounds, scale_down_floor
from controller.decision_inputs import record_advice as _record_advice
from controller.decision_inputs import record_observation as _record_observation
from controller.entry_demand import entry_floor, router_waiting
from controller.observation_checks import sanitize_observation
from controller.policy import KubernetesTarget, LocalTarget, Mode, Policy
from controller.types import (
    Action,
    Advice,
    Decision,
    Effects,
    ForecastView,
    LoadHistory,
    PolicyObservation,
    Reason,
    Scalar,
    ScalingAdvisor,
    TickInput,
)

__all__ = ["CoreConfig", "DecisionCore", "PolicyState", "sanitize_observation"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CoreConfig:
    tick_interval_s: float = 15.0
    stale_after_s: float | None = None
    """Observations older than this hold the policy; ``None`` means 3 tick intervals."""
    isolate_advisor_errors: bool = True
    """An advisor that raises has no opinion (reason ``advisor_error``) and the tick goes on;
    False lets the exception through (tests, replays), so bugs surface where they are."""
    stabilize_scale_down: bool = True
    """Scale down no lower than the highest need seen within the cooldown (as the HPA's
    stabilization window does), so a one-tick dip does not shrink the fleet."""
    clock_skew_tolerance_s: float = 5.0
    """An observation dated more than this after ``now_s`` is invalid (``clock_skew``): a clock
    ahead of ours would pass the staleness check and push the cooldown into the future."""

    def __post_init__(self) -> None:
        if self.tick_interval_s <= 0:
            raise ValueError(f"tick_interval_s must be > 0, got {self.tick_interval_s}")
        if self.stale_after_s is not None and self.stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be > 0, got {self.stale_after_s}")
        if not self.clock_skew_tolerance_s >= 0:
            raise ValueError(f"clock_skew_tolerance_s must be >= 0, got {self.clock_skew_tolerance_s}")

    @property
    def stale_limit_s(self) -> float:
        return 3 * self.tick_interval_s if self.stale_after_s is None else self.stale_after_s


@dataclass(kw_only=True, slots=True)
class PolicyState:
    """What the core remembers about one policy between ticks."""

    last_change_s: float | None = None
    """When the replica count last changed: a scale decision the core applied, or one seen from outside."""
    last_observed_replicas: int | None = None
    recent_needs: list[tuple[float, int]] = field(default_factory=list)
    """(time, replicas needed) over the last cooldown: a scale-down goes no lower than their max."""
    last_decision: Decision | None = field(default=None, repr=False)
    undo_last_change: tuple[float | None] | None = field(default=None, repr=False)
    """(last change before it) while the last decision applied awaits being carried out."""


class DecisionCore:
    """Guardrails over the max of several advisors' needs."""

    def __init__(
        self,
        advisors: Sequence[ScalingAdvisor] | None = None,
        config: CoreConfig | None = None,
        state: Mapping[str, PolicyState] | None = None,
    ) -> None:
        self.advisors: tuple[ScalingAdvisor, ...] = tuple(advisors) if advisors is not None else (ReactiveAdvisor(),)
        if not self.advisors:
            raise ValueError("DecisionCore needs at least one advisor")
        names = [advisor.name for advisor in self.advisors]
        if len(set(names)) != len(names):
            raise ValueError(f"advisor names must be unique, got {names}")
        self.config = config or CoreConfig()
        self.state: dict[str, PolicyState] = dict(state or {})
        self._forecast: ForecastView | None = None

    def tick(self, inp: TickInput) -> Effects:
        decisions = tuple(
            self.decide(policy, inp.observations.get(name), inp.now_s) for name, policy in sorted(inp.policies.items())
        )
        for gone in self.state.keys() - inp.policies.keys():
            self.forget(gone)
        diagnostics: dict[str, Scalar] = {"policies": len(decisions)}
        actions = Counter(d.action for d in decisions)
        diagnostics |= {f"actions.{action}": actions.get(action, 0) for action in ("hold", "scale_up", "scale_down")}
        diagnostics["to_apply"] = sum(1 for d in decisions if d.apply)
        for reason, count in sorted(Counter(r for d in decisions for r in d.reasons[1:]).items()):
            diagnostics[f"reasons.{reason}"] = count
        next_tick_s = inp.now_s + self.config.tick_interval_s
        return Effects(decisions=decisions, next_tick_s=next_tick_s, diagnostics=diagnostics)

    def refit(self) -> None:
        """The forecast refits due at the last tick, run once its decisions are out (see PredictiveAdvisor.refit)."""
        for refit in filter(None, (getattr(advisor, "refit", None) for advisor in self.advisors)):
            refit()

    def forget(self, policy: str) -> None:
        """Drop what the core and its advisors keep for a policy: deleted, or created again under its name."""
        self.state.pop(policy, None)
        for advisor in self.advisors:
            forget = getattr(advisor, "forget", None)
            if forget is not None:
                forget(policy)

    def warm_start(self, policy: Policy, history: LoadHistory) -> int:
        """Seed the advisors' per-policy history (oldest first, one value per tick); returns advisors seeded (one
        that says False ignored it)."""
        seeded = 0
        for advisor in self.advisors:
            seed = getattr(advisor, "warm_start", None)
            if seed is not None and seed(policy, history) is not False:
                seeded += 1
        return seeded

    def record_change(self, policy: str, at_s: float) -> None:
        """Tell the core the replica count changed at ``at_s`` (e.g. an actuator applied it late)."""
        state = self.state.setdefault(policy, PolicyState())
        # A time ahead of the core's clock is clamped to now_s at the next decision (see _evaluate).
        state.last_change_s = at_s if state.last_change_s is None else max(state.last_change_s, at_s)

    def not_carried_out(self, policy: str) -> None:
        """The last decision to apply was not carried out (the actuator failed, or another replica leads): nothing
        changed, so it starts no scale-down cooldown, nor counts as ours when the count moves."""
        state = self.state.get(policy)
        if state is not None and state.undo_last_change is not None and state.last_decision is not None:
            (state.last_change_s,), state.undo_last_change = state.undo_last_change, None
            state.last_decision = replace(state.last_decision, apply=False)

    def decide(self, policy: Policy, observation: PolicyObservation | None, now_s: float) -> Decision:
        state = self.state.get(policy.name)
        if state is None:
            state = self.state[policy.name] = PolicyState()
        self._forecast = None
        state.undo_last_change = None
        decision = self._evaluate(policy, observation, now_s, state)
        if self._forecast is not None:
            decision = replace(decision, forecast=self._forecast)
        if decision.apply and decision.action != "hold":
            state.last_change_s, state.undo_last_change = now_s, (state.last_change_s,)
        state.last_decision = decision
        return decision

    def _evaluate(self, policy: Policy, obs: PolicyObservation | None, now_s: float, state: PolicyState) -> Decision:
        scaling = policy.scaling
        inputs: dict[str, Scalar] = {
            "now_s": now_s,
            "mode": str(policy.mode),
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "max_step": scaling.max_step,
            "max_scale_down_rate": scaling.max_scale_down_rate,
            "scale_down_cooldown_s": scaling.scale_down_cooldown_s,
        }
        hold = _Hold(policy, inputs, now_s)
        usable = self._usable_observation(policy, obs, now_s, state, hold)
        if isinstance(usable, Decision):
            return usable
        obs, current = usable
        consensus = self._consult_advisors(policy, obs, now_s, state, current, hold)
        if isinstance(consensus, Decision):
            return consensus
        need, why, notes, undo_to = consensus
        desired, guards = clamp_to_bounds(need, current, scaling)
        budget = obs.replica_budget
        if budget is not None and desired > current and desired > budget:
            hold.inputs["replica_budget"] = budget
            desired = max(current, budget)
            guards.append(Reason.HOST_BUDGET)
            notes.append(f"the actuator has room for {budget} replicas")
        if desired < current:
            ungated = len(guards)
            gated = self._gate_scale_down(policy, obs, now_s, state, current, desired, why, guards, hold)
            undo = None if undo_to is None or undo_to >= current or obs.errors else max(desired, undo_to)
            if isinstance(gated, Decision) and undo is None:
                return gated
            desired = current if isinstance(gated, Decision) else gated
            if undo is not None and undo < desired:
                # A verdict, not the load's noise, says these replicas bought nothing: the guards do not keep them
                # (nor are they cited, as bounds that held).
                desired, guards[ungated:] = undo, []
                inputs.pop("stabilized_need", None)
                inputs["undo_to"] = undo_to
                notes.append(f"a scale-up from {undo_to} bought nothing: given back at once")
        if abs(desired - current) > scaling.max_step:
            desired = current + int(math.copysign(scaling.max_step, desired - current))
            guards.append(Reason.MAX_STEP)

        action: Action = "hold" if desired == current else ("scale_up" if desired > current else "scale_down")
        reasons = bound_first((action, *why, *guards), need, current, desired)
        if action == "hold" and need == current and Reason.SCALE_UP_PENDING not in reasons:
            reasons = (*reasons, Reason.STEADY)
        verb = "hold at" if action == "hold" else f"{action.replace('_', ' ')} {current} ->"
        detail = f"{verb} {desired}: " + "; ".join(notes)
        if guards:
            detail += f" [{', '.join(guards)}]"
        return _decision(policy, action, current, desired, reasons, detail, inputs, now_s)

    def _usable_observation(
        self, policy: Policy, obs: PolicyObservation | None, now_s: float, state: PolicyState, hold: _Hold
    ) -> tuple[PolicyObservation, int] | Decision:
        """The sanitized observation and replica count, or the hold (or move to a bound) when there is none."""
        if policy.mode == Mode.OFF:
            current_off = obs.current_replicas if obs is not None else None
            return hold(Reason.MODE_OFF, "mode is off: no decisions", current_off)
        if obs is None:
            return hold(Reason.INSUFFICIENT_DATA, "no observation for this policy")
        if obs.policy != policy.name:
            return hold(Reason.INSUFFICIENT_DATA, f"the observation is for policy {obs.policy!r}")
        if not math.isfinite(obs.observed_at_s):
            return hold(Reason.INSUFFICIENT_DATA, f"observation time {obs.observed_at_s!r} is not a number")
        obs, invalid = sanitize_observation(obs)
        if invalid:
            hold.inputs["invalid_fields"] = ",".join(invalid)
        _record_observation(hold.inputs, obs, now_s)
        if state.last_change_s is not None and state.last_change_s > now_s:
            state.last_change_s = now_s  # a change is never in the future: it would block scale-downs
        current = obs.current_replicas
        if current is None:
            return hold(Reason.INSUFFICIENT_DATA, "the replica count is unknown")
        age_s = now_s - obs.observed_at_s
        if -age_s > self.config.clock_skew_tolerance_s:
            return hold(
                Reason.CLOCK_SKEW,
                f"observation is dated {-age_s:.1f} s in the future "
                f"(tolerance {self.config.clock_skew_tolerance_s:.1f} s): the source's clock is ahead",
                current,
            )
        self._note_outside_change(state, current, min(obs.observed_at_s, now_s))
        if age_s > self.config.stale_limit_s:
            detail = f"observation is {age_s:.1f} s old (limit {self.config.stale_limit_s:.1f} s)"
            bounded = self._to_bound(policy, current, Reason.STALE_DATA, detail, hold.inputs, now_s)
            return bounded or hold(Reason.STALE_DATA, detail, current)
        return obs, current

    def _consult_advisors(
        self, policy: Policy, obs: PolicyObservation, now_s: float, state: PolicyState, current: int, hold: _Hold
    ) -> tuple[int, tuple[str, ...], list[str], int | None] | Decision:
        """(replicas needed, reasons, one note per advisor, the size an ineffective scale-up may be undone to at
        once), or the hold (or move to a bound) when none knows."""
        inputs = hold.inputs
        if self.config.isolate_advisor_errors:
            advices = [(advisor.name, _advise(advisor, policy, obs, now_s)) for advisor in self.advisors]
        else:
            advices = [(advisor.name, advisor.advise(policy, obs, now_s)) for advisor in self.advisors]
        for name, advice in advices:
            _record_advice(inputs, name, advice)
            if advice.forecast is not None and self._forecast is None:
                self._forecast = advice.forecast
        opinions = [(name, advice) for name, advice in advices if advice.replicas_needed is not None]
        if not opinions and current == 0 and router_waiting(obs) > 0:
            # A fleet at zero has no engines to tell the advisors anything; the router's queue is demand.
            opinions = [("entry", Advice(replicas_needed=0, reasons=(Reason.INSUFFICIENT_DATA,)))]
        if not opinions:
            errors = [(name, advice) for name, advice in advices if Reason.ADVISOR_ERROR in advice.reasons]
            extra = (Reason.ADVISOR_ERROR,) if errors else ()
            why_not = "; ".join(f"{name} advisor failed: {advice.details.get('error')}" for name, advice in errors)
            detail = why_not or "no advisor had enough data"
            bounded = self._to_bound(policy, current, Reason.INSUFFICIENT_DATA, detail, inputs, now_s, *extra)
            return bounded or hold(Reason.INSUFFICIENT_DATA, detail, current, *extra)
        need = max(advice.replicas_needed for _, advice in opinions if advice.replicas_needed is not None)
        why = tuple(dict.fromkeys(r for _, a in opinions for r in a.reasons if r != Reason.INSUFFICIENT_DATA))
        failed = [name for name, advice in advices if Reason.ADVISOR_ERROR in advice.reasons]
        if failed:
            why = (*why, Reason.ADVISOR_ERROR)
        notes = [
            f"{name} needs {advice.replicas_needed} ({','.join(advice.reasons) or '-'})" for name, advice in opinions
        ]
        need, why, entry_note = entry_floor(policy, obs, current, need, why)  # the rules about zero
        if entry_note is not None:
            notes.append(entry_note)
        inputs["replicas_needed"] = need
        _remember_need(state, now_s, need, policy.scaling.scale_down_cooldown_s)
        undo = [advice.undo_to for _, advice in opinions if advice.undo_to is not None]
        return need, why, notes, max(undo) if undo else None

    def _gate_scale_down(
        self, policy: Policy, obs: PolicyObservation, now_s: float, state: PolicyState, current: int, desired: int,
        why: tuple[str, ...], guards: list[str], hold: _Hold,
    ) -> int | Decision:
        """How far a wanted scale-down may go: partial data and the cooldown hold it; stabilization and the
        scale-down rate limit it."""
        scaling = policy.scaling
        since_s = None if state.last_change_s is None else now_s - state.last_change_s
        hold.inputs["since_last_change_s"] = since_s
        blocked: tuple[str, str] | None = None
        if obs.errors:
            blocked = (Reason.PARTIAL_DATA, f"the source reported errors: {'; '.join(obs.errors)}")
        elif since_s is not None and since_s < scaling.scale_down_cooldown_s:
            blocked = (Reason.COOLDOWN, f"last change {since_s:.0f} s ago, cooldown {scaling.scale_down_cooldown_s} s")
        if blocked is None and self.config.stabilize_scale_down:
            stable = min(max(n for _, n in state.recent_needs), scaling.max_replicas)
            if stable > desired:
                hold.inputs["stabilized_need"] = stable
                if stable >= current:
                    return hold(
                        Reason.STABILIZATION,
                        f"would scale down to {desired}, but {stable} were needed within the last "
                        f"{scaling.scale_down_cooldown_s} s",
                        current,
                        *why,
                        *guards,
                    )
                desired = stable
                guards.append(Reason.STABILIZATION)
        floor = None if blocked is not None else scale_down_floor(current, desired, scaling)
        if floor is not None:
            desired = floor
            guards.append(Reason.SCALE_DOWN_RATE)
        if blocked is not None:
            # Data-driven scale-downs wait; bringing a fleet above max_replicas back to the
            # bound is the policy's own rule and needs no data.
            bound = min(current, scaling.max_replicas)
            if bound == current:
                return hold(blocked[0], f"would scale down to {desired}; {blocked[1]}", current, *why, *guards)
            desired = bound
            guards.append(blocked[0])
        return desired

    @staticmethod
    def _to_bound(
        policy: Policy, current: int, why: str, detail: str, inputs: dict[str, Scalar], now_s: float, *more: str
    ) -> Decision | None:
        """Without usable data, a replica count outside the policy's bounds still moves toward them.

        The bounds are the policy's own rule and need no data (the bound is the reason logged, the missing data
        next); a fleet at zero has no engines and so no metrics, and would otherwise never come back.  Scale-downs
        happen only to enforce max_replicas.  ``None`` when the count is within bounds.
        """
        scaling = policy.scaling
        if current < scaling.min_replicas:
            desired, guard = scaling.min_replicas, Reason.BELOW_MIN
        elif current > scaling.max_replicas:
            desired, guard = scaling.max_replicas, Reason.ABOVE_MAX
        else:
            return None
        step: tuple[str, ...] = ()
        if abs(desired - current) > scaling.max_step:
            desired = current + int(math.copysign(scaling.max_step, desired - current))
            step = (Reason.MAX_STEP,)
        action: Action = "scale_up" if desired > current else "scale_down"
        bounds = f"[{scaling.min_replicas}, {scaling.max_replicas}]"
        text = f"{action.replace('_', ' ')} {current} -> {desired}: outside the bounds {bounds}; {detail}"
        return _decision(policy, action, current, desired, (action, guard, why, *more, *step), text, inputs, now_s)

    @staticmethod
    def _note_outside_change(state: PolicyState, current: int, observed_at_s: float) -> None:
        """A replica count the core did not ask for (someone else scaled) restarts the cooldown.

        ``observed_at_s`` is clamped to the core's clock by the caller: a change dated in the
        future would hold every scale-down until that time.
        """
        previous = state.last_observed_replicas
        state.last_observed_replicas = current
        if previous is None and not state.recent_needs:
            # First sight (a new policy, or the controller restarted): the replicas running now
            # count as needed, as Kubernetes seeds its HPA's recommendations, so a quiet first
            # minute cannot shrink a fleet sized for what comes next before the window has passed.
            state.recent_needs.append((observed_at_s, current))
        if previous is None or previous == current:
            return
        last = state.last_decision
        if last is not None and last.apply and last.desired_replicas == current:
            return  # our own change showing up
        if state.last_change_s is None or observed_at_s > state.last_change_s:
            state.last_change_s = observed_at_s


@dataclass(frozen=True)
class _Hold:
    """Makes the hold decisions of one evaluation (sharing its ``inputs``, which keep filling in)."""

    policy: Policy
    inputs: dict[str, Scalar]
    now_s: float

    def __call__(self, reason: str, detail: str, current: int | None = None, *more: str) -> Decision:
        return Decision(
            policy=self.policy.name,
            action="hold",
            current_replicas=current,
            desired_replicas=current,
            reasons=_codes((Reason.HOLD, reason, *more)),
            detail=detail,
            inputs=self.inputs,
            decided_at_s=self.now_s,
        )


def _decision(
    policy: Policy, action: Action, current: int, desired: int, reasons: Sequence[str], detail: str,
    inputs: dict[str, Scalar], now_s: float,
) -> Decision:
    """A decision that changes (or holds) replicas; applied unless the mode or the target forbids it."""
    apply = action != "hold"
    if apply and policy.mode == Mode.ADVISORY:
        apply = False
        reasons = (*reasons, Reason.MODE_ADVISORY)
    if apply and not isinstance(policy.target, (KubernetesTarget, LocalTarget)):
        apply = False
        reasons = (*reasons, Reason.READ_ONLY_TARGET)
    inputs["desired_replicas"] = desired
    return Decision(
        policy=policy.name,
        action=action,
        current_replicas=current,
        desired_replicas=desired,
        reasons=_codes(reasons),
        detail=detail,
        inputs=inputs,
        decided_at_s=now_s,
        apply=apply,
    )


def _advise(advisor: ScalingAdvisor, policy: Policy, obs: PolicyObservation, now_s: float) -> Advice:
    """One advisor's advice; an advisor that fails has no opinion (and says why) instead of stopping the tick."""
    try:
        return advisor.advise(policy, obs, now_s)
    except Exception as exc:  # a faulty advisor must not stop the guardrails of every policy
        return Advice(
            replicas_needed=None,
            reasons=(Reason.ADVISOR_ERROR,),
            details={"error": f"{type(exc).__name__}: {exc}"[:500]},
        )


def _remember_need(state: PolicyState, now_s: float, need: int, window_s: float) -> None:
    """Keep the needs of the last ``window_s`` (the scale-down stabilization window)."""
    recent = state.recent_needs
    recent.append((now_s, need))
    if recent[0][0] < now_s - window_s or recent[0][0] > now_s:
        state.recent_needs = [(t, n) for t, n in recent if now_s - window_s <= t <= now_s]


def _codes(reasons: Sequence[str]) -> tuple[str, ...]:
    """Plain strings (not enum members), so decisions serialize and compare as data; duplicates dropped."""
    return tuple(dict.fromkeys(str(reason) for reason in reasons))
