"""Faults the tick must keep to the policy they concern: an actuator's unexpected error, a failed write of the
decision log, a target switched away from the local actuator, a scale that never ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.actuators import DryRunActuator, ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.policy import Policy
from tests.controller.test_service import OVERLOADED, Clock, _policy, _service


class OneBreaks(DryRunActuator):
    """Policy "a"'s reads or scales raise what no actuator promises (a bug, an answer of the wrong shape)."""

    def __init__(self, *, on: str) -> None:
        super().__init__()
        self.on = on

    async def replicas(self, policy: Policy) -> ReplicaCount:
        if policy.name == "a" and self.on == "replicas":
            raise KeyError('"level"')
        return await super().replicas(policy)

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading
    ) -> ScaleResult:
        if policy.name == "a" and self.on == "scale":
            raise RuntimeError("unexpected answer")
        return await super().scale(policy, replicas, still_leading=still_leading)


def test_an_unexpected_scale_error_fails_its_own_decision_and_the_others_are_applied_and_logged(
    tmp_path: Path,
) -> None:
    actuator = OneBreaks(on="scale")
    service, store, registry = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(_policy("a"))
    store.create_policy(_policy("b"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    effects = asyncio.run(service.tick())
    assert effects is not None and service.ticks == 1
    assert actuator.calls == [("b", 3)]
    outcomes = {d.policy: (d.outcome, d.detail) for d in store.list_decisions()}
    assert outcomes["b"][0] == "applied"
    assert outcomes["a"][0] == "failed" and "RuntimeError: unexpected answer" in outcomes["a"][1]
    assert registry.get_sample_value("moeslo_errors_total", {"component": "actuator"}) == 1


def test_an_unexpected_replica_read_error_holds_only_its_own_policy(tmp_path: Path) -> None:
    actuator = OneBreaks(on="replicas")
    service, store, registry = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(_policy("a"))
    store.create_policy(_policy("b"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert actuator.calls == [("b", 3)]
    runtime = service.runtime("a")
    assert runtime is not None and any("KeyError" in e for e in runtime.errors)
    assert registry.get_sample_value("moeslo_errors_total", {"component": "actuator"}) == 1
