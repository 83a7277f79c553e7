"""The dry-run actuator: in-memory counts, and the same leadership check as the actuators that write."""

from __future__ import annotations

import asyncio

import pytest

from controller.actuators import DryRunActuator
from controller.errors import LeadershipLostError
from controller.policy import Policy


def _policy() -> Policy:
    return Policy.model_validate({"name": "p", "target": {"kind": "deployment", "namespace": "prod", "name": "q"}})


def test_a_lease_lost_before_the_scale_changes_no_count() -> None:
    actuator = DryRunActuator()
    with pytest.raises(LeadershipLostError, match="p: the lease was lost before the scale to 3"):
        asyncio.run(actuator.scale(_policy(), 3, still_leading=lambda: False))
    assert (actuator.counts, actuator.calls) == ({"p": 1}, [])
    assert asyncio.run(actuator.scale(_policy(), 1, still_leading=lambda: False)).changed is False  # nothing to write
    assert asyncio.run(actuator.scale(_policy(), 3)).changed and actuator.calls == [("p", 3)]
