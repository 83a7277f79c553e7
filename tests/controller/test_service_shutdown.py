"""The controller service stopped (SIGTERM) while a tick carries out its decisions: what was applied is logged."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.actuators import DryRunActuator, ScaleResult
from controller.policy import Policy
from tests.controller.test_service import OVERLOADED, Clock, _policy, _service


class SlowAnswerActuator(DryRunActuator):
    """Applies a scale at once, then waits for the API server's answer (a PATCH whose reply is on its way)."""

    def __init__(self) -> None:
        super().__init__()
        self.applying = asyncio.Event()

    async def scale(self, policy: Policy, replicas: int) -> ScaleResult:
        result = await super().scale(policy, replicas)
        self.applying.set()
        await asyncio.sleep(0.2)
        return result


def test_a_shutdown_mid_tick_lets_the_applied_scale_reach_the_decision_log(tmp_path: Path) -> None:
    """The tick loop was cancelled in the actuator's await: the scale was applied and never logged, so the
    restarted controller forgot its scale-down cooldown.  Now the actions and their records finish first."""
    actuator = SlowAnswerActuator()
    service, store, _registry = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]

    async def run() -> None:
        await service.start()
        await asyncio.wait_for(actuator.applying.wait(), timeout=10)
        # What a SIGTERM does (the server's lifespan ends); a tick loop that swallowed the cancellation would
        # never end, and this would time out.
        await asyncio.wait_for(service.stop(), timeout=10)

    asyncio.run(run())
    assert actuator.calls == [("chat", 3)]
    [record] = store.list_decisions()
    assert (record.action, record.outcome, record.desired_replicas) == ("scale_up", "applied", 3)
    assert "dryrun: 1 -> 3" in record.detail
    assert service.ticks == 0  # the cut-short tick ends with its records: the loop stops there

