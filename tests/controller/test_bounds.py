"""How far one scale-down may go (``max_scale_down_rate``), alone and in the decision core."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.bounds import scale_down_floor
from controller.policy import Policy, Scaling
from tests.controller.test_core import idle, tick, watched
from tests.controller.test_entry_demand import quiet, routed_policy


def wide_policy(**scaling: float) -> Policy:
    """A policy whose max_step and cooldown do not limit a scale-down, so only the rate does."""
    bounds = {"min_replicas": 1, "max_replicas": 50, "max_step": 50, "scale_down_cooldown_s": 0} | scaling
    target = {"kind": "deployment", "namespace": "llm", "name": "chat"}
    return Policy.model_validate({"name": "chat", "target": target, "scaling": bounds})


@pytest.mark.parametrize(
    ("current", "desired", "rate", "floor"),
    [
        (20, 3, 2.0, 10),
        (20, 12, 2.0, None),  # above the floor: not limited
        (5, 1, 2.0, 3),  # the floor rounds up
        (20, 1, 4.0, 5),
        (20, 1, 1000.0, None),
        (4, 0, 2.0, None),  # zero is the entry's rule, not the capacity model's
        (2, 1, 1.5, None),  # a rate below 2 still lets a small fleet lose one replica
        (3, 1, 1.5, 2),
        (6, 1, 1.2, 5),
        (6, 1, 1.5, 4),  # large enough that the rate, not the one replica, is the floor
    ],
)
def test_a_scale_down_keeps_the_current_fleet_over_the_rate(
    current: int, desired: int, rate: float, floor: int | None
) -> None:
    assert scale_down_floor(current, desired, Scaling(max_replicas=50, max_scale_down_rate=rate)) == floor


def test_a_fleet_above_max_replicas_comes_down_to_the_bound_in_one_decision() -> None:
    """A lowered max_replicas is the policy's own rule: the rate does not keep the fleet above it."""
    assert scale_down_floor(20, 3, Scaling(max_replicas=5)) == 5
    assert scale_down_floor(20, 5, Scaling(max_replicas=5)) is None
    decision = tick(watched(20), 1000.0, idle(999.0, 20), wide_policy(max_replicas=5))
    assert (decision.action, decision.desired_replicas) == ("scale_down", 5)
    assert "above_max" in decision.reasons and "scale_down_rate" in decision.reasons


def test_the_core_halves_an_idle_fleet_at_most_per_decision() -> None:
    unlimited = tick(watched(20), 1000.0, idle(999.0, 20), wide_policy(max_scale_down_rate=1000.0))
    assert unlimited.action == "scale_down" and unlimited.desired_replicas < 10
    assert "scale_down_rate" not in unlimited.reasons
    core = watched(20)
    first = tick(core, 1000.0, idle(999.0, 20), wide_policy())
    assert (first.action, first.desired_replicas) == ("scale_down", 10)
    assert first.reasons[-1] == "scale_down_rate"
    assert first.inputs["max_scale_down_rate"] == 2.0
    second = tick(core, 1015.0, idle(1014.0, 10), wide_policy())
    assert (second.action, second.desired_replicas) == ("scale_down", 5)


@pytest.mark.parametrize("rate", [1.01, 1.2, 1.5])
def test_a_slow_rate_still_brings_a_small_idle_fleet_down_one_replica_at_a_time(rate: float) -> None:
    """ceil(current / rate) is current itself for a small fleet and a rate below 2: one replica goes anyway."""
    core, replicas, now = watched(4), 4, 1000.0
    for _ in range(3):
        decision = tick(core, now, idle(now - 1.0, replicas), wide_policy(max_scale_down_rate=rate))
        assert (decision.action, decision.desired_replicas) == ("scale_down", replicas - 1)
        replicas, now = replicas - 1, now + 15.0
    assert replicas == 1


def test_an_idle_entry_still_takes_a_fleet_to_zero_at_once() -> None:
    core, policy = watched(4), routed_policy()
    down = tick(core, 1000.0, quiet(999.0, 4), policy)
    assert (down.action, down.desired_replicas) == ("scale_down", 0)
    assert "router_idle" in down.reasons and "scale_down_rate" not in down.reasons


@pytest.mark.parametrize("rate", [1.0, 0.5, float("inf"), "2"])
def test_a_rate_that_would_forbid_or_not_bound_a_scale_down_is_refused(rate: object) -> None:
    with pytest.raises(ValidationError, match="max_scale_down_rate"):
        Scaling.model_validate({"max_scale_down_rate": rate})
