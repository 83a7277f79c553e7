"""The controller service stopped (SIGTERM) while a tick carries out its decisions: what was applied is logged, and
what outlasts the shutdown grace is cut short and logged ``interrupted``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from controller.actuators import DryRunActuator, ScaleResult, StillLeading, always_leading
from controller.actuators.placement import Rebalancer
from controller.policy import ImbalanceObjective, LocalTarget, Mode, Objectives, Policy
from controller.rebalance import TriggerSettings
from tests.controller.actuators.test_placement import StallingEngine
from tests.controller.test_service import OVERLOADED, Clock, _policy, _service


class SlowAnswerActuator(DryRunActuator):
    """Applies a scale at once, then waits for the API server's answer (a PATCH whose reply is on its way)."""

    def __init__(self) -> None:
        super().__init__()
        self.applying = asyncio.Event()

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        result = await super().scale(policy, replicas, still_leading=still_leading, expected=expected)
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



class TakesItsTimeActuator(DryRunActuator):
    """Applies a scale at once, then takes each policy's time for the answer (60 s: an apply that outlasts any
    grace; a cancellation cuts it short)."""

    def __init__(self, take_s: dict[str, float]) -> None:
        super().__init__()
        self.take_s = take_s
        self.applying: set[str] = set()
        self.all_applying = asyncio.Event()
        self.cut_short: list[str] = []

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        result = await super().scale(policy, replicas, still_leading=still_leading, expected=expected)
        self.applying.add(policy.name)
        if self.applying == self.take_s.keys():
            self.all_applying.set()
        try:
            await asyncio.sleep(self.take_s[policy.name])
        except asyncio.CancelledError:
            self.cut_short.append(policy.name)
            raise
        return result


def _stopped_mid_action(service: Any, started: asyncio.Event) -> float:
    """Start the service, stop it (as a SIGTERM does) once ``started`` is set; the seconds the stop took."""

    async def run() -> float:
        await service.start()
        await asyncio.wait_for(started.wait(), timeout=10)
        began = time.monotonic()
        await asyncio.wait_for(service.stop(), timeout=30)
        return time.monotonic() - began

    return asyncio.run(run())


def test_an_action_that_outlasts_the_shutdown_grace_is_cut_short_and_logged_interrupted(tmp_path: Path) -> None:
    """A shutdown waited for every action to end: an expert rebalance's apply (up to 300 s) outlasted the pod's
    termination grace period, the pod was killed and the record lost.  Now the grace bounds the wait: the action
    still running is cut short and logged with its outcome unknown; the one that finished is logged as applied."""
    actuator = TakesItsTimeActuator({"chat": 60.0, "batch": 0.05})
    service, store, _registry = _service(tmp_path, Clock(), actuator=actuator)
    service.shutdown_grace_s = 0.3
    store.create_policy(_policy("chat"))
    store.create_policy(_policy("batch"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    took_s = _stopped_mid_action(service, actuator.all_applying)
    assert 0.3 <= took_s < 3.0  # the grace and a little: not the action's 60 s
    assert actuator.cut_short == ["chat"]
    records = {r.policy: r for r in store.list_decisions()}
    assert sorted(records) == ["batch", "chat"]
    chat, batch = records["chat"], records["batch"]
    assert (chat.action, chat.outcome, chat.desired_replicas) == ("scale_up", "interrupted", 3)
    assert "shutdown's 0.3 s grace ran out" in chat.detail and "unknown" in chat.detail
    assert (batch.action, batch.outcome, batch.desired_replicas) == ("scale_up", "applied", 3)
    assert "dryrun: 1 -> 3" in batch.detail
    assert service.ticks == 0


def test_a_rebalance_apply_that_outlasts_the_shutdown_grace_is_logged_interrupted(tmp_path: Path) -> None:
    engine = StallingEngine(stalls_on="http://engine-a:8000")  # a vLLM rearrangement: up to 300 s
    service, store, _registry = _service(tmp_path, Clock(), actuator=DryRunActuator())
    rebalancer = service.rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)
    service.shutdown_grace_s = 0.2
    policy = Policy(name="moe", target=LocalTarget(endpoints=("http://engine-a:8000",)), mode=Mode.ENFORCE,
                    objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=10)))
    store.create_policy(policy)

    async def seen_before() -> None:  # the imbalance seen for 10 s before the service's tick (at 1000 s)
        for now_s in (990.0, 995.0):
            assert await rebalancer.tick(policy, ["http://engine-a:8000"], now_s) == []

    asyncio.run(seen_before())
    took_s = _stopped_mid_action(service, engine.applying)
    assert 0.2 <= took_s < 3.0
    [record] = [r for r in store.list_decisions() if r.action == "rebalance"]
    assert (record.outcome, record.reason) == ("interrupted", "rebalance")
    assert record.detail.startswith("http://engine-a:8000: predicted worst-layer CV")
    assert record.detail.endswith("a shutdown cut the apply short: whether the engine took the placement is unknown")
