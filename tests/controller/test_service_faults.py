"""Faults the tick must keep to the policy they concern: an actuator's unexpected error, a failed write of the
decision log, a target switched away from the local actuator, a scale that never ends."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from contracts.catalogue import HOST_REPLICA_BUDGET
from contracts.errors import UnavailableError
from controller.actuators import DryRunActuator, LocalActuator, ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.config import FINAL_READ_TIMEOUT_S, MARK_BUDGET_S, LocalActuatorConfig, load_settings
from controller.decision_log import DecisionLogWriter
from controller.policy import Policy
from controller.store import Store
from harness.processes import free_port
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
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        if policy.name == "a" and self.on == "scale":
            raise RuntimeError("unexpected answer")
        return await super().scale(policy, replicas, still_leading=still_leading, expected=expected)


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


def _log_fails(store: Store, times: int) -> list[int]:
    """The store's next ``times`` decision-log writes fail (a database locked, a failover); returns the batch sizes
    of every write tried."""
    real, tried = store.append_decisions, []

    def append(records):  # type: ignore[no-untyped-def]
        tried.append(len(records))
        if len(tried) <= times:
            raise UnavailableError("policy store (postgresql): server closed the connection unexpectedly")
        return real(records)

    store.append_decisions = append  # type: ignore[method-assign]
    return tried


def test_records_a_failed_log_write_left_are_written_at_the_next_tick_and_carry_the_cooldown(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    service, store, _ = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy())
    tried = _log_fails(store, 1)
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())  # scales 1 -> 3; its record's write fails
    assert actuator.calls == [("chat", 3)] and store.list_decisions() == []
    clock.now_s += 15
    asyncio.run(service.tick())
    assert tried == [1, 2]  # the unwritten one first, then this tick's
    logged = [(d.action, d.outcome) for d in reversed(store.list_decisions())]
    assert logged[0] == ("scale_up", "applied")
    restarted, _, _ = _service(tmp_path, Clock(), actuator=actuator)
    restarted.restore_state()
    state = restarted.core.state.get("chat")
    assert state is not None and state.last_change_s is not None  # the scale-up's cooldown survives the restart


def test_unwritten_records_are_bounded_the_oldest_dropped_and_counted(tmp_path: Path) -> None:
    service, store, _ = _service(tmp_path, Clock())
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    writer = service.decision_log
    writer.pending_max = 3
    tried = _log_fails(store, 4)
    for _ in range(4):
        asyncio.run(service.tick())
    assert len(writer.pending) == 3 and writer.dropped == 1
    first_kept = writer.pending[0]
    asyncio.run(service.tick())
    assert tried[-1] == 4 and writer.pending == []
    assert store.list_decisions()[-1].at == first_kept.at


def test_a_stop_tries_the_unwritten_records_once_more(tmp_path: Path) -> None:
    service, store, _ = _service(tmp_path, Clock())
    store.create_policy(_policy())
    _log_fails(store, 1)
    asyncio.run(service.tick())
    assert store.list_decisions() == [] and len(service.decision_log.pending) == 1
    asyncio.run(service.stop())
    assert len(store.list_decisions()) == 1 and service.decision_log.pending == []
    assert isinstance(service.decision_log, DecisionLogWriter)


def test_a_local_policys_replicas_stop_when_its_target_is_switched_to_one_the_actuator_does_not_manage(
    tmp_path: Path,
) -> None:
    (tmp_path / "ckpt").mkdir()
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), cpus_per_replica=1,
                                 checkpoint=str(tmp_path / "ckpt"), stop_timeout_s=1)  # fmt: skip
    actuator = LocalActuator(config)
    service, store, _ = _service(tmp_path, Clock(), actuator=actuator)
    local = {"name": "chat", "target": {"kind": "local", "model": "m1"}, "scaling": {"min_replicas": 1,
                                                                                     "max_replicas": 1}}  # fmt: skip
    store.create_policy(Policy.model_validate(local))

    async def scenario() -> None:
        try:
            await service.tick()
            (replica,) = actuator.replicas_by_policy["chat"]
            store.replace_policy(Policy.model_validate({**local, "target": {"kind": "model", "model": "m1"}}))
            await service.tick()
            await actuator.stopped()  # a stop drains in the background
            assert replica.process.poll() is not None, "the replica runs on for nobody"
            assert actuator.replicas_by_policy.get("chat", []) == []
        finally:
            await actuator.aclose()

    asyncio.run(scenario())


class ScaleNeverEnds(DryRunActuator):
    """A scale whose answer never completes (an API server that trickles it a byte at a time, each read within its
    timeout): it runs in a worker thread, as the Kubernetes actuator's, and stops only when told it no longer leads."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_ended = threading.Event()

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        def trickle() -> ScaleResult:
            while still_leading():
                time.sleep(0.02)
            self.thread_ended.set()
            raise AssertionError("no write after the service gave up on the scale")

        return await asyncio.to_thread(trickle)


def test_a_scale_that_never_ends_is_cut_at_its_bound_and_logged_failed(tmp_path: Path) -> None:
    actuator = ScaleNeverEnds()
    service, store, registry = _service(tmp_path, Clock(), actuator=actuator)
    service.scale_timeout_s = 0.3
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(asyncio.wait_for(service.tick(), 5.0))
    [record] = store.list_decisions()
    assert record.outcome == "failed" and "no complete answer within 0.3 s" in record.detail
    assert "may have landed" in record.detail
    assert registry.get_sample_value("moeslo_errors_total", {"component": "actuator"}) == 1
    assert actuator.thread_ended.wait(5.0), "the scale's thread writes on after it was given up"


def test_the_scale_bound_covers_the_kubernetes_actuators_own() -> None:
    settings = load_settings(actuator="kubernetes", kubernetes={"retry_deadline_s": 12, "request_timeout_s": 10})
    assert settings.scale_backstop_s == 12 + 10 + FINAL_READ_TIMEOUT_S + MARK_BUDGET_S  # a scale-down's pod costs
    unmarked = load_settings(actuator="kubernetes", kubernetes={"retry_deadline_s": 12, "request_timeout_s": 10,
                                                                 "pod_deletion_cost": False})  # fmt: skip
    assert unmarked.scale_backstop_s == 12 + 10 + FINAL_READ_TIMEOUT_S
    assert load_settings(actuator="local").scale_backstop_s is None  # it starts processes; stops run apart


class StopsABrokenReplica(DryRunActuator):
    """Each read finds a broken replica and stops it: while it drains, it holds a slice of a budget of one."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = 1

    def replica_budget(self, policy: Policy) -> int | None:
        return self.budget

    async def replicas(self, policy: Policy) -> ReplicaCount:
        self.budget = 0
        return await super().replicas(policy)


def test_the_replica_budget_is_read_after_the_count_whose_read_may_stop_a_replica(tmp_path: Path) -> None:
    """Read before, it offered the slice of a broken replica the read had begun to stop: the scale-up to replace it
    failed with "every CPU slice is in use" instead of holding at the budget."""
    actuator = StopsABrokenReplica()
    service, store, registry = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(_policy("a"))
    asyncio.run(service.tick())
    assert registry.get_sample_value(HOST_REPLICA_BUDGET, {"policy": "a"}) == 0
