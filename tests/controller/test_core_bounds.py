"""The core's bounds without data, the reactive advisor's floor, observations from the future, and the guards a
given-back scale-up goes past."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.advisors import ReactiveAdvisor
from controller.core import CoreConfig, DecisionCore, PolicyState
from controller.decision_log import logged_reason
from controller.policy import Policy
from controller.types import Advice, PolicyObservation
from tests.controller.test_core import idle, make_policy, observe, tick


def no_metrics(at_s: float, replicas: int) -> PolicyObservation:
    """What a source sees of a fleet with no engines to scrape: only the replica count."""
    return PolicyObservation(policy="chat", observed_at_s=at_s, current_replicas=replicas, ready_replicas=replicas)


def test_fleet_at_zero_without_metrics_comes_back_to_min() -> None:
    core = DecisionCore()
    policy = make_policy(min_replicas=2)
    decision = tick(core, 1000.0, no_metrics(999.0, 0), policy)
    assert (decision.action, decision.desired_replicas, decision.apply) == ("scale_up", 2, True)
    assert decision.reasons == ("scale_up", "below_min", "insufficient_data")
    assert core.state["chat"].last_change_s == 1000.0


def test_bound_without_data_moves_at_most_max_step() -> None:
    policy = make_policy(min_replicas=6, max_step=4)
    decision = tick(DecisionCore(), 1000.0, no_metrics(999.0, 0), policy)
    assert (decision.action, decision.desired_replicas) == ("scale_up", 4)
    assert decision.reasons == ("scale_up", "below_min", "insufficient_data", "max_step")


def test_fleet_above_max_without_metrics_comes_down_to_max() -> None:
    core = DecisionCore()
    core.record_change("chat", 999.0)  # inside the cooldown: the bound needs no data and no wait
    decision = tick(core, 1000.0, no_metrics(999.0, 12), make_policy(max_replicas=10))
    assert (decision.action, decision.desired_replicas) == ("scale_down", 10)
    assert decision.reasons == ("scale_down", "above_max", "insufficient_data")


def test_stale_data_enforces_bounds_but_never_scales_down_within_them() -> None:
    core = DecisionCore(config=CoreConfig(tick_interval_s=10.0))
    up = tick(core, 1000.0, idle(900.0, 1), make_policy(min_replicas=3))
    assert (up.action, up.desired_replicas) == ("scale_up", 3)
    assert up.reasons == ("scale_up", "below_min", "stale_data")
    down = tick(DecisionCore(), 1000.0, idle(900.0, 12), make_policy(max_replicas=10))
    assert (down.action, down.desired_replicas) == ("scale_down", 10)
    assert down.reasons == ("scale_down", "above_max", "stale_data")
    within = tick(DecisionCore(), 1000.0, idle(900.0, 8), make_policy(min_replicas=0, max_replicas=10))
    assert (within.action, within.desired_replicas) == ("hold", 8)
    assert within.reasons == ("hold", "stale_data")


def test_bound_without_data_respects_advisory_mode() -> None:
    decision = tick(DecisionCore(), 1000.0, no_metrics(999.0, 0), make_policy(mode="advisory", min_replicas=2))
    assert (decision.action, decision.desired_replicas, decision.apply) == ("scale_up", 2, False)
    assert "mode_advisory" in decision.reasons


def test_idle_fleet_with_min_zero_never_scales_to_zero() -> None:
    """Engine-side signals cannot bring a fleet back from zero, so they never take it there."""
    policy = make_policy(min_replicas=0, max_step=10)
    advice = ReactiveAdvisor().advise(policy, observe(999.0, 1, running_requests=0.0, kv_cache_usage=0.0), 1000.0)
    assert advice.replicas_needed == 1
    core = DecisionCore()
    core.state[policy.name] = PolicyState(last_observed_replicas=4)  # watched for longer than the window
    shrink = tick(core, 1000.0, observe(999.0, 4, running_requests=0.0, kv_cache_usage=0.0), policy)
    assert (shrink.action, shrink.desired_replicas) == ("scale_down", 2)  # toward 1, half the fleet at most
    assert "low_utilization" in shrink.reasons
    later = tick(core, 2000.0, observe(1999.0, 1, running_requests=0.0, kv_cache_usage=0.0), policy)
    assert (later.action, later.desired_replicas) == ("hold", 1)


@pytest.mark.parametrize("ahead_s", [6.0, 3600.0])
def test_observation_from_the_future_holds(ahead_s: float) -> None:
    core = DecisionCore()
    tick(core, 1000.0, observe(999.0, 4))
    decision = tick(core, 1015.0, idle(1015.0 + ahead_s, 6))
    assert (decision.action, decision.desired_replicas, decision.apply) == ("hold", 6, False)
    assert decision.reasons == ("hold", "clock_skew")
    # It is not taken as an outside change dated in the future.
    assert core.state["chat"].last_change_s is None


def test_small_clock_skew_is_tolerated_and_clamped_to_now() -> None:
    core = DecisionCore()
    tick(core, 1000.0, observe(999.0, 4))
    # Someone else scaled to 6; the source's clock is 3 s ahead of ours.
    decision = tick(core, 1015.0, idle(1018.0, 6))
    assert decision.reasons[:2] == ("hold", "cooldown")
    assert core.state["chat"].last_change_s == 1015.0
    # The cooldown ends 180 s after *our* now, not after the source's time.
    after = tick(core, 1015.0 + 180.0, idle(1015.0 + 180.0, 6))
    assert after.action == "scale_down"


def test_change_recorded_in_the_future_is_clamped_to_now() -> None:
    core = DecisionCore()
    core.record_change("chat", 5000.0)
    first = tick(core, 1000.0, idle(999.0))
    assert first.reasons[:2] == ("hold", "cooldown")
    assert core.state["chat"].last_change_s == 1000.0
    assert tick(core, 1181.0, idle(1180.0)).action == "scale_down"


def test_clock_skew_tolerance_is_validated() -> None:
    with pytest.raises(ValueError, match="clock_skew_tolerance_s"):
        CoreConfig(clock_skew_tolerance_s=-1.0)
    strict = DecisionCore(config=CoreConfig(clock_skew_tolerance_s=0.0))
    assert tick(strict, 1000.0, replace(observe(999.0), observed_at_s=1000.5)).reasons == ("hold", "clock_skew")


class _Says:
    """An advisor with a fixed opinion."""

    name = "stub"

    def __init__(self, needed: int, *reasons: str) -> None:
        self.advice = Advice(replicas_needed=needed, reasons=reasons)

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        return self.advice


@pytest.mark.parametrize(("current", "needed", "bounds", "expected"), [
    (0, 0, {"min_replicas": 1}, ("scale_up", 1, "below_min")),  # moeslo up's first tick: no engine yet
    (1, 1, {"min_replicas": 3}, ("scale_up", 3, "below_min")),
    (12, 12, {"max_replicas": 10}, ("scale_down", 10, "above_max")),
])
def test_a_change_the_bounds_alone_make_is_logged_under_the_bound(
    current: int, needed: int, bounds: dict[str, int], expected: tuple[str, int, str]
) -> None:
    """The advisors see no reason to change; the policy's bounds do.  The scale-up from zero was logged and
    counted as ``scale_up:within_slo`` (a fleet that serves nothing said to meet its SLOs)."""
    core = DecisionCore([_Says(needed, "within_slo")])
    decision = tick(core, 1000.0, no_metrics(999.0, current), make_policy(**bounds))
    assert (decision.action, decision.desired_replicas, logged_reason(decision)) == expected
    assert "within_slo" in decision.reasons  # what the advisor said is kept, after the bound


def test_a_change_the_advisors_want_keeps_their_reason_when_a_bound_also_applies() -> None:
    decision = tick(DecisionCore([_Says(2, "slo_burn")]), 1000.0, no_metrics(999.0, 1), make_policy(min_replicas=3))
    assert (decision.action, decision.desired_replicas, logged_reason(decision)) == ("scale_up", 3, "slo_burn")


class _GivesBack:
    """An advisor whose verdict is that the scale-up from ``undo_to`` bought nothing."""

    name = "sizing"

    def __init__(self, needed: int, undo_to: int) -> None:
        self.advice = Advice(replicas_needed=needed, reasons=("current_load", "scale_ineffective"), undo_to=undo_to)

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        return self.advice


@pytest.mark.parametrize(("state", "bounds", "current", "expected", "overridden"), [
    # 5 were needed 50 s ago: stabilization alone would keep 5 of the 6.
    (PolicyState(last_change_s=-1000.0, recent_needs=[(950.0, 5)]), {}, 6, 4, "stabilization"),
    # At rate 2 a scale-down from 8 keeps 4.
    (PolicyState(last_change_s=-1000.0), {"max_scale_down_rate": 2}, 8, 3, "scale_down_rate"),
])
def test_a_scale_up_given_back_cites_no_guard_it_went_past(
    state: PolicyState, bounds: dict[str, int], current: int, expected: int, overridden: str,
) -> None:
    """The verdict takes the fleet below what stabilization or the scale-down rate would keep: those guards did not
    hold, and the decision's reasons, detail and inputs said they did (6 -> 4 logged under ``stabilization``)."""
    core = DecisionCore([_GivesBack(2, expected)])
    core.state["chat"] = replace(state, last_observed_replicas=current)
    policy = make_policy(max_step=10, **bounds)
    decision = tick(core, 1000.0, observe(1000.0, current), policy)
    assert (decision.action, decision.desired_replicas) == ("scale_down", expected)
    assert decision.inputs["undo_to"] == expected
    assert overridden not in decision.reasons and overridden not in decision.detail
    assert "stabilized_need" not in decision.inputs
    assert decision.reasons == ("scale_down", "current_load", "scale_ineffective")
