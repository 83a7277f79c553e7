"""The controller service's tick loop, with faults injected: source outages, actuator failures,
standby replicas, restarts; and one run over real /metrics pages."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from contracts.errors import UnavailableError
from controller.actuators import Actuator, DryRunActuator, LocalActuator, ScaleResult, StillLeading, always_leading
from controller.config import LocalActuatorConfig
from controller.core import CoreConfig, DecisionCore, PolicyState
from controller.errors import ActuationError
from controller.policy import Policy
from controller.service import ControllerService
from controller.sources import ScrapeSource
from controller.store import Store
from controller.telemetry import ControllerMetrics
from controller.types import PolicyObservation, SliSnapshot
from harness.processes import free_port
from tests.controller.loop_answers import run_answering
from tests.controller.sources.engine_page import EngineMetrics, MetricsServer, RouterPage


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class ScriptedSource:
    """Returns what the test sets: an observation template per policy, or an outage."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.fields: dict[str, object] = {}
        self.down = False
        self.calls = 0

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        self.calls += 1
        if self.down:
            raise UnavailableError("prometheus http://127.0.0.1:9: ConnectError: refused")
        return {
            p.name: PolicyObservation(policy=p.name, observed_at_s=now_s, **self.fields)  # type: ignore[arg-type]
            for p in policies
        }

    async def aclose(self) -> None:
        return None


class FlakyActuator(DryRunActuator):
    """A dry-run actuator whose next ``failures`` scale calls fail (after their own retries)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.attempts = 0

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        self.attempts += 1
        if self.failures:
            self.failures -= 1
            raise ActuationError(f"deployment prod/{policy.name}: scale to {replicas} failed after 5 attempts: 503")
        return await super().scale(policy, replicas, still_leading=still_leading, expected=expected)


class Follower:
    is_leader = False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def _policy(name: str = "chat", mode: str = "enforce") -> Policy:
    return Policy.model_validate(
        {
            "name": name,
            "mode": mode,
            "target": {"kind": "deployment", "namespace": "prod", "name": name},
            "scaling": {"min_replicas": 1, "max_replicas": 6, "max_step": 2, "scale_down_cooldown_s": 180},
        }
    )


OVERLOADED = {"queue_depth": 20.0, "running_requests": 4.0, "kv_cache_usage": 0.95}


def _sli(at_s: float, good: float = 0.999) -> SliSnapshot:
    return SliSnapshot(
        observed_at_s=at_s, requests_in_window=500, ttft_good_ratio=good, itl_good_ratio=0.999,
        ttft_p99_s=0.1, itl_p99_s=0.005,
        ttft_good_ratio_by_window={"5m": good, "1h": 0.998, "30d": 0.995},
        itl_good_ratio_by_window={"5m": 0.999, "30d": 0.999},
    )


def _service(tmp_path: Path, clock: Clock, *, actuator: Actuator | None = None, elector: object = None,
             source: object = None, core: DecisionCore | None = None
             ) -> tuple[ControllerService, Store, CollectorRegistry]:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    registry = CollectorRegistry()
    service = ControllerService(
        store=store,
        source=source or ScriptedSource(clock),  # type: ignore[arg-type]
        actuator=actuator or DryRunActuator(),
        core=core or DecisionCore(config=CoreConfig(tick_interval_s=15, stale_after_s=60)),
        metrics=ControllerMetrics(registry),
        elector=elector,  # type: ignore[arg-type]
        tick_interval_s=15,
        stale_after_s=60,
        clock=clock,
    )
    return service, store, registry


def test_overload_scales_up_logs_the_decision_and_exports_metrics(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    service, store, registry = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert actuator.calls == [("chat", 3)]  # 1 ready replica with 20 waiting: 1 -> 3 (max_step 2)
    [record] = store.list_decisions()
    assert (record.action, record.reason, record.outcome) == ("scale_up", "queue_depth", "applied")
    assert (record.current_replicas, record.desired_replicas) == (1, 3)
    assert record.inputs["queue_depth"] == 20.0 and record.inputs["reasons"][:2] == ["scale_up", "queue_depth"]
    assert "dryrun: 1 -> 3" in record.detail
    sample = registry.get_sample_value
    assert sample("moeslo_desired_replicas", {"policy": "chat"}) == 3
    assert sample("moeslo_decisions_total", {"policy": "chat", "action": "scale_up", "reason": "queue_depth"}) == 1
    assert sample("moeslo_sli", {"policy": "chat", "sli": "queue_depth"}) == 20.0
    assert sample("moeslo_evaluation_duration_seconds_count") == 1
    assert sample("moeslo_leader") == 1
    runtime = service.runtime("chat")
    assert runtime is not None and (runtime.current_replicas, runtime.desired_replicas) == (1, 3)


def test_budget_and_burn_rates_reach_status_and_metrics(tmp_path: Path) -> None:
    clock = Clock()
    service, store, registry = _service(tmp_path, clock)
    store.create_policy(_policy())
    service.source.fields = {"queue_depth": 0.0, "running_requests": 1.0, "kv_cache_usage": 0.5,  # type: ignore[attr-defined]
                             "sli": _sli(clock.now_s, good=0.98)}
    asyncio.run(service.tick())
    runtime = service.runtime("chat")
    assert runtime is not None and runtime.stale is False
    assert runtime.error_budget_remaining["ttft"] == pytest.approx(1 - 0.005 / 0.01)
    assert runtime.burn_rates["ttft"]["5m"] == pytest.approx(2.0)
    assert runtime.burn_rates["ttft"]["1h"] == pytest.approx(0.2)
    assert "30d" not in runtime.burn_rates["ttft"]
    labels = {"policy": "chat", "slo": "ttft", "window": "5m"}
    assert registry.get_sample_value("moeslo_burn_rate", labels) == pytest.approx(2.0)
    itl_budget = registry.get_sample_value("moeslo_error_budget_remaining", {"policy": "chat", "slo": "itl"})
    assert itl_budget == pytest.approx(0.9)


def test_what_the_capacity_model_sizes_with_is_exported(tmp_path: Path) -> None:
    """The prompt-length tail and the online latency corrections, as the decision's inputs have them."""
    from controller.builder import CoreOptions, build_decision_core
    from controller.feasibility import prompt_length_tail

    clock = Clock()
    service, store, registry = _service(tmp_path, clock, core=build_decision_core(CoreOptions()))
    store.create_policy(_policy())
    lengths = ((1000.0, 0.0), (2000.0, 450.0), (20000.0, 495.0), (50000.0, 500.0), (float("inf"), 500.0))
    sample = registry.get_sample_value
    fields = {"queue_depth": 0.0, "running_requests": 1.0, "kv_cache_usage": 0.2, "request_rate_rps": 2.0,
              "prompt_tokens_per_s": 6000.0, "output_tokens_per_s": 200.0}  # fmt: skip
    service.source.fields = {**fields, "sli": _sli(clock.now_s)}  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert sample("moeslo_capacity_prompt_length_cv2", {"policy": "chat"}) is None  # no lengths read yet
    service.source.fields = {**fields, "sli": replace(_sli(clock.now_s), prompt_tokens_buckets=lengths)}  # type: ignore[attr-defined]
    clock.now_s += 15
    asyncio.run(service.tick())
    expected = prompt_length_tail(lengths)
    assert expected is not None
    assert sample("moeslo_capacity_prompt_length_cv2", {"policy": "chat"}) == pytest.approx(expected[0], abs=1e-3)
    assert sample("moeslo_capacity_prompt_length_p99_over_mean", {"policy": "chat"}) == pytest.approx(
        expected[1], abs=1e-3
    )
    assert sample("moeslo_ttft_infeasible_share", {"policy": "chat"}) is not None
    inputs = max(store.list_decisions(), key=lambda d: d.at).inputs  # the last tick's
    for sli in ("ttft", "itl"):
        gauge = sample("moeslo_capacity_latency_correction", {"policy": "chat", "sli": sli})
        assert gauge is not None and gauge == pytest.approx(inputs[f"sizing.predictive.{sli}_correction"])
    itl_correction = sample("moeslo_capacity_latency_correction", {"policy": "chat", "sli": "itl"})
    assert itl_correction is not None and itl_correction < 1.0  # 5 ms p99s: faster than the profile predicts
    store.delete_policy("chat")  # a deleted policy's gauges go with it
    clock.now_s += 15
    asyncio.run(service.tick())
    for name in ("moeslo_capacity_prompt_length_cv2", "moeslo_capacity_prompt_length_p99_over_mean",
                 "moeslo_ttft_infeasible_share"):  # fmt: skip
        assert sample(name, {"policy": "chat"}) is None
    assert sample("moeslo_capacity_latency_correction", {"policy": "chat", "sli": "itl"}) is None


def test_source_outage_holds_reports_stale_and_recovers(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    actuator.counts["chat"] = 4
    service, store, registry = _service(tmp_path, clock, actuator=actuator)
    source: ScriptedSource = service.source  # type: ignore[assignment]
    store.create_policy(_policy())
    source.down = True
    for _ in range(3):
        asyncio.run(service.tick())
        clock.now_s += 15
    assert actuator.calls == []  # never a scale-down (let alone to zero) on a metrics outage
    decisions = store.list_decisions()
    assert {d.action for d in decisions} == {"hold"} and {d.reason for d in decisions} == {"insufficient_data"}
    runtime = service.runtime("chat")
    assert runtime is not None and runtime.stale and "prometheus" in runtime.errors[0]
    assert registry.get_sample_value("moeslo_errors_total", {"component": "scrape"}) == 3
    source.down = False
    source.fields = OVERLOADED
    asyncio.run(service.tick())
    assert actuator.calls == [("chat", 6)]  # recovered by itself: acts on fresh data again
    assert not service.runtime("chat").stale  # type: ignore[union-attr]


def test_actuator_failure_is_reported_retried_next_tick_and_never_applied_twice(tmp_path: Path) -> None:
    clock = Clock()
    actuator = FlakyActuator()
    actuator.failures = 1
    service, store, registry = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    [failed] = store.list_decisions()
    assert failed.outcome == "failed" and "after 5 attempts: 503" in failed.detail
    shown = service.runtime("chat").decision  # type: ignore[union-attr]  # what /v1/status and the page show
    assert shown is not None and shown["outcome"] == "failed" and "after 5 attempts: 503" in shown["actuation"]
    assert registry.get_sample_value("moeslo_errors_total", {"component": "actuator"}) == 1
    assert actuator.calls == []
    clock.now_s += 15
    asyncio.run(service.tick())  # decides afresh from the count it reads back (still 1): 1 -> 3
    clock.now_s += 15
    service.source.fields = {"queue_depth": 0.0, "running_requests": 4.0, "kv_cache_usage": 0.6}  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert actuator.calls == [("chat", 3)]  # applied exactly once
    assert [d.outcome for d in store.list_decisions()][:2] == ["held", "applied"]


def test_a_failed_scale_down_is_retried_next_tick_not_after_the_cooldown(tmp_path: Path) -> None:
    clock = Clock()
    actuator = FlakyActuator()
    actuator.counts["chat"] = 6
    core = DecisionCore(config=CoreConfig(tick_interval_s=15, stale_after_s=60),
                        state={"chat": PolicyState(last_observed_replicas=6)})  # fmt: skip
    service, store, _ = _service(tmp_path, clock, actuator=actuator, core=core)
    store.create_policy(_policy())
    service.source.fields = {"queue_depth": 0.0, "running_requests": 0.0, "kv_cache_usage": 0.01,  # type: ignore[attr-defined]
                             "sli": _sli(clock.now_s)}  # fmt: skip
    actuator.failures = 1
    asyncio.run(service.tick())
    clock.now_s += 15
    service.source.fields["sli"] = _sli(clock.now_s)  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    outcomes = [(d.action, d.outcome) for d in reversed(store.list_decisions())]
    assert outcomes == [("scale_down", "failed"), ("scale_down", "applied")]  # not held by a cooldown nothing began
    assert actuator.calls == [("chat", 4)]


class StallingActuator(DryRunActuator):
    """Policy "a"'s scale call waits until policy "b"'s has been made (an API server slow for one workload)."""

    def __init__(self) -> None:
        super().__init__()
        self.b_scaled = asyncio.Event()

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        if policy.name == "b":
            self.b_scaled.set()
        else:
            try:
                await asyncio.wait_for(self.b_scaled.wait(), timeout=2.0)
            except TimeoutError as exc:
                raise ActuationError("a: stalled, and b waited behind it") from exc
        return await super().scale(policy, replicas, still_leading=still_leading, expected=expected)


def test_one_stalled_actuation_does_not_hold_the_others(tmp_path: Path) -> None:
    clock = Clock()
    actuator = StallingActuator()
    service, store, _ = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy("a"))
    store.create_policy(_policy("b"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert sorted(actuator.calls) == [("a", 3), ("b", 3)]
    assert {d.outcome for d in store.list_decisions()} == {"applied"}


def test_standby_evaluates_but_neither_acts_nor_logs(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    service, store, registry = _service(tmp_path, clock, actuator=actuator, elector=Follower())
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert actuator.calls == [] and store.list_decisions() == []
    assert service.runtime("chat").desired_replicas == 3  # type: ignore[union-attr]
    assert registry.get_sample_value("moeslo_leader") == 0


def test_advisory_mode_logs_but_never_actuates(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    service, store, _ = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy(mode="advisory"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    [record] = store.list_decisions()
    assert (record.action, record.outcome) == ("scale_up", "advisory") and actuator.calls == []
    assert "mode_advisory" in record.inputs["reasons"]


def test_cooldown_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    actuator = DryRunActuator()
    service, store, _ = _service(tmp_path, clock, actuator=actuator)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert actuator.calls == [("chat", 3)]
    store.close()
    # A new process: same database, fresh core; the fleet is idle and could shrink, but the
    # cooldown that began with the last applied scale-up is still running.
    restarted, store2, _ = _service(tmp_path, Clock(), actuator=actuator)
    restarted.restore_state()
    idle = {"queue_depth": 0.0, "running_requests": 0.0, "kv_cache_usage": 0.01, "sli": _sli(restarted.clock())}
    restarted.source.fields = idle  # type: ignore[attr-defined]
    asyncio.run(restarted.tick())
    newest = store2.list_decisions(limit=1)[0]
    assert (newest.action, newest.reason) == ("hold", "cooldown")
    assert len(store2.list_decisions()) == 2  # the log survived too


def test_deleted_policies_leave_the_metrics(tmp_path: Path) -> None:
    clock = Clock()
    service, store, registry = _service(tmp_path, clock)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert registry.get_sample_value("moeslo_desired_replicas", {"policy": "chat"}) == 3
    store.delete_policy("chat")
    asyncio.run(service.tick())
    assert registry.get_sample_value("moeslo_desired_replicas", {"policy": "chat"}) is None
    assert service.runtime("chat") is None


def test_a_deleted_policys_local_replicas_stop_and_give_their_cpus_back(tmp_path: Path) -> None:
    """Renaming a policy (create the new, delete the old) must not leave the old one's processes holding the
    host budget: the new one would get no replicas."""
    (tmp_path / "ckpt").mkdir()
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), cpus_per_replica=1,
                                 checkpoint=str(tmp_path / "ckpt"))  # fmt: skip
    actuator = LocalActuator(config)
    service, store, _ = _service(tmp_path, Clock(), actuator=actuator)
    local = {"name": "old", "target": {"kind": "local"}, "scaling": {"min_replicas": 1, "max_replicas": 1}}
    store.create_policy(Policy.model_validate(local))

    async def scenario() -> None:
        try:
            await service.tick()
            (replica,) = actuator.replicas_by_policy["old"]
            budget = actuator.replica_budget(Policy.model_validate({**local, "name": "new"}))
            store.delete_policy("old")
            await service.tick()
            await actuator.stopped()  # a stop drains in the background
            assert replica.process.poll() is not None and "old" not in actuator.replicas_by_policy
            assert actuator.replica_budget(Policy.model_validate({**local, "name": "new"})) == (budget or 0) + 1
        finally:
            await actuator.aclose()

    asyncio.run(scenario())


def test_ticks_over_real_metrics_pages(tmp_path: Path) -> None:
    engine = EngineMetrics("m")
    server = MetricsServer(engine)
    clock = Clock()
    target = {"kind": "local", "model": "m", "endpoints": [server.url]}
    policy = Policy.model_validate({"name": "local", "target": target})
    service_ref: list[ControllerService] = []

    def endpoints(p: Policy) -> list[str]:
        return service_ref[0].endpoints_for(p)

    source = ScrapeSource(endpoints)
    service, store, registry = _service(tmp_path, clock, source=source)
    service_ref.append(service)
    store.create_policy(policy)

    async def scenario() -> None:
        await service.tick()
        engine.requests([0.1] * 95 + [0.7] * 5, [0.01] * 100)
        engine.waiting.set(0)
        clock.now_s += 15
        await service.tick()
        await source.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
    runtime = service.runtime("local")
    assert runtime is not None and runtime.errors == []
    assert runtime.sli["ttft_good_ratio"] == pytest.approx(0.95)
    assert runtime.burn_rates["ttft"]["5m"] == pytest.approx(5.0)
    assert registry.get_sample_value("moeslo_sli", {"policy": "local", "sli": "itl_good_ratio"}) == 1.0
    assert len(store.list_decisions()) == 2


def test_a_fleet_at_zero_scales_up_on_the_routers_queue(tmp_path: Path) -> None:
    """``controller serve`` with the direct-scrape source: the policy names the router, whose queue wakes the fleet."""
    router = RouterPage()
    server = MetricsServer(router)  # type: ignore[arg-type]
    clock, actuator = Clock(), DryRunActuator()
    policy = Policy.model_validate({
        "name": "zero", "target": {"kind": "deployment", "namespace": "prod", "name": "zero"},
        "scaling": {"min_replicas": 0, "max_replicas": 4}, "router": {"endpoints": [server.url]},
    })  # fmt: skip
    actuator.counts["zero"] = 0
    source = ScrapeSource(lambda _policy: ())  # a fleet at zero: no engine to scrape
    service, store, registry = _service(tmp_path, clock, actuator=actuator, source=source)
    store.create_policy(policy)

    async def scenario() -> None:
        await service.tick()  # nothing waits: stays at zero
        router.hold(2)
        router.refuse(3)  # and refused 3 over the 15 s: demand the status shows
        clock.now_s += 15
        await service.tick()
        await source.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
    assert actuator.calls == [("zero", 1)]
    idle, woken = sorted(store.list_decisions(), key=lambda d: d.id or 0)
    assert (idle.action, woken.action, woken.reason) == ("hold", "scale_up", "router_queue")
    assert woken.inputs["router_queued"] == 2.0
    runtime = service.runtime("zero")
    assert runtime is not None and runtime.seen["router_queued"] == 2.0
    assert woken.inputs["router_refused_rps"] == pytest.approx(0.2) == runtime.seen["router_refused_rps"]
    assert registry.get_sample_value("moeslo_sli", {"policy": "zero", "sli": "router_queued"}) == 2.0


def test_observation_template_is_complete() -> None:
    # Guards the scripted source: every field it sets exists on the boundary type.
    obs = replace(PolicyObservation(policy="x", observed_at_s=0.0), **OVERLOADED)  # type: ignore[arg-type]
    assert (obs.queue_depth, obs.running_requests, obs.kv_cache_usage) == (20.0, 4.0, 0.95)


def test_the_decision_log_is_pruned_to_its_retention(tmp_path: Path) -> None:
    clock = Clock()
    service, store, _ = _service(tmp_path, clock)
    service.decisions_keep = 7
    store.create_policy(_policy())
    service.source.fields = {"queue_depth": 0.0, "running_requests": 4.0, "kv_cache_usage": 0.6}  # type: ignore[attr-defined]

    async def ticks() -> None:
        for _ in range(100):
            await service.tick()
            clock.now_s += 15

    asyncio.run(ticks())
    kept = store.list_decisions(limit=1000)
    assert len(kept) == 7 and kept[0].tick_s == 1000.0 + 99 * 15


def test_non_finite_values_never_break_the_api(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from controller.api import create_app
    from controller.config import ControllerSettings

    clock = Clock()
    service, store, registry = _service(tmp_path, clock)
    store.create_policy(_policy())
    sli = replace(_sli(clock.now_s), ttft_p99_s=float("inf"))
    service.source.fields = {"queue_depth": float("nan"), "running_requests": 4.0, "sli": sli}  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    settings = ControllerSettings(db=str(tmp_path / "c.db"))
    client = TestClient(create_app(settings, store, registry=registry, service=service))
    status = client.get("/v1/status")
    assert status.status_code == 200
    assert status.json()["policies"][0]["sli"]["ttft_p99_seconds"] is None
    decisions = client.get("/v1/decisions")
    assert decisions.status_code == 200 and decisions.json()["items"][0]["inputs"]["queue_depth"] is None


class LosesTheLease(Follower):
    """A leader whose lease is lost while the tick's first scale is under way."""

    is_leader = True


class LosesTheLeaseWhenScaled(DryRunActuator):
    """Its scale is written as the leader; by the time the answer comes, the lease is lost (when ``loses``)."""

    def __init__(self, elector: LosesTheLease, *, loses: bool = True) -> None:
        super().__init__()
        self.elector = elector
        self.loses = loses

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        result = await super().scale(policy, replicas, still_leading=still_leading, expected=expected)
        if self.loses:
            self.elector.is_leader = False  # another replica holds the lease from now on
        return result


def test_a_lease_lost_mid_tick_stops_the_ticks_remaining_actions(tmp_path: Path) -> None:
    elector = LosesTheLease()
    clock = Clock()
    actuator = LosesTheLeaseWhenScaled(elector)
    service, store, _ = _service(tmp_path, clock, actuator=actuator, elector=elector)
    store.create_policy(_policy("first"))
    store.create_policy(_policy("second"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    assert len(actuator.calls) == 1
    outcomes = sorted(record.outcome for record in store.list_decisions())
    assert outcomes == ["applied", "standby"]


def test_a_policy_created_again_learns_nothing_from_the_deleted_ones_stored_load(tmp_path: Path) -> None:
    """The load history is stored by policy name: one deleted and created again (another model, say) was
    warm-started from the deleted one's load.  Only what was recorded since the policy's creation is read."""
    import time

    from controller.load_history import LoadHistoryKeeper

    clock = Clock()
    service, store, _ = _service(tmp_path, clock)
    wall = [time.time() - 1800.0]  # the deleted policy's ticks, half an hour before it is created again
    service.history = LoadHistoryKeeper(store, bin_s=15.0, keep_s=86400.0, wall_clock=lambda: wall[0],
                                        flush_every_ticks=1)  # fmt: skip
    service.source.fields = {"request_rate_rps": 40.0, "prompt_tokens_per_s": 4e4,  # type: ignore[attr-defined]
                             "output_tokens_per_s": 4e3}  # fmt: skip
    store.create_policy(_policy())
    for _ in range(20):
        asyncio.run(service.tick())
        clock.now_s += 15.0
        wall[0] += 15.0
    store.delete_policy("chat")
    asyncio.run(service.tick())  # the service forgets it
    store.create_policy(_policy())
    wall[0] = time.time()
    asyncio.run(service.tick())
    runtime = service.runtime("chat")
    assert runtime is not None and runtime.seen["history_warm_start"] == "none"


def test_a_policy_deleted_and_created_again_between_two_ticks_starts_afresh(tmp_path: Path) -> None:
    """A policy deleted and created again under its name (another model) before the next tick: the service saw the
    name at both ticks and kept everything the deleted one had learnt (forecaster history, capacity corrections,
    scale checks, cooldown), so the new workload was sized from the old one's load."""
    from controller.builder import CoreOptions, build_decision_core
    from controller.sizing import SizingAdvisor

    clock = Clock()
    core = build_decision_core(CoreOptions(tick_interval_s=15.0, stale_after_s=60.0))
    actuator = DryRunActuator()
    service, store, _ = _service(tmp_path, clock, core=core, actuator=actuator)
    load = {"request_rate_rps": 40.0, "prompt_tokens_per_s": 4e4, "output_tokens_per_s": 8e3, "queue_depth": 0.0,
            "running_requests": 10.0, "kv_cache_usage": 0.3}  # fmt: skip
    store.create_policy(_policy())
    for _ in range(20):
        service.source.fields = {**load, "sli": SliSnapshot(  # type: ignore[attr-defined]
            observed_at_s=clock.now_s, requests_in_window=5000, ttft_good_ratio=0.9, itl_good_ratio=0.9,
            ttft_p99_s=3.0, itl_p99_s=0.2)}  # fmt: skip
        asyncio.run(service.tick())
        clock.now_s += 15.0
    sizing = core.advisors[0]
    assert isinstance(sizing, SizingAdvisor)
    assert sizing.predictive.history_bins("chat") == 20
    store.delete_policy("chat")
    store.create_policy(_policy())
    service.source.fields = {**load, "request_rate_rps": 1.0}  # type: ignore[attr-defined]
    actuator.counts["chat"] = 1
    effects = asyncio.run(service.tick())
    assert effects is not None
    decision = effects.for_policy("chat")
    assert sizing.predictive.history_bins("chat") == 1
    assert decision.inputs["sizing.predictive.ttft_correction"] == 1.0
    assert {at for at, _ in core.state["chat"].recent_needs} == {clock.now_s}  # its stabilization window starts now


def test_forecast_refits_run_once_the_decisions_are_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.builder import CoreOptions, build_decision_core
    from controller.forecast.auto import AutoForecaster

    clock = Clock()
    service, store, registry = _service(tmp_path, clock, core=build_decision_core(CoreOptions(tick_interval_s=15)))
    store.create_policy(_policy())
    service.source.fields = {"request_rate_rps": 3.0, "prompt_tokens_per_s": 600.0,  # type: ignore[attr-defined]
                             "output_tokens_per_s": 180.0, "queue_depth": 0.0, "running_requests": 2.0}
    logged_at_refit: list[int] = []
    refit = AutoForecaster.refit

    def noted(self: AutoForecaster) -> None:
        logged_at_refit.append(len(store.list_decisions()))
        refit(self)

    monkeypatch.setattr(AutoForecaster, "refit", noted)
    refit_ticks = 0
    for tick in range(40):
        clock.now_s += 15
        done = len(logged_at_refit)
        asyncio.run(service.tick())
        assert set(logged_at_refit[done:]) <= {tick + 1}  # each after its tick's decision was logged
        refit_ticks += len(logged_at_refit) > done
    assert refit_ticks >= 3  # the first fit, and again as the history grew
    assert registry.get_sample_value("moeslo_forecast_refit_duration_seconds_count") == 40


def test_the_event_loop_answers_while_the_forecasts_refit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refit waits for a coroutine on the loop to run: on the loop itself it would wait in vain."""
    clock = Clock()
    service, store, _ = _service(tmp_path, clock)
    store.create_policy(_policy())
    service.source.fields = {"queue_depth": 0.0, "running_requests": 2.0}  # type: ignore[attr-defined]
    refitting, answered = threading.Event(), threading.Event()
    refits: list[tuple[str, bool]] = []  # (thread, whether the loop answered while it ran)

    def refit() -> None:
        refitting.set()
        refits.append((threading.current_thread().name, answered.wait(timeout=2.0)))

    monkeypatch.setattr(service.core, "refit", refit)

    loop_thread = run_answering(service.tick(), refitting, answered)
    assert len(refits) == 1
    refit_thread, loop_answered = refits[0]
    assert loop_answered and refit_thread != loop_thread


def test_the_event_loop_answers_while_the_decisions_are_recorded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Each decision's record, status and gauges (~10 ms for 100 policies) wait for a coroutine on the loop to run:
    on the loop itself they would wait in vain."""
    clock = Clock()
    service, store, registry = _service(tmp_path, clock)
    store.create_policy(_policy())
    service.source.fields = {"queue_depth": 0.0, "running_requests": 2.0}  # type: ignore[attr-defined]
    recording, answered = threading.Event(), threading.Event()
    seen: list[tuple[str, bool]] = []  # (thread, whether the loop answered while the gauges were set)
    set_slis = service.metrics.set_slis

    def waiting_set_slis(policy: str, values: Mapping[str, float | None]) -> None:
        recording.set()
        seen.append((threading.current_thread().name, answered.wait(timeout=2.0)))
        set_slis(policy, values)

    monkeypatch.setattr(service.metrics, "set_slis", waiting_set_slis)

    loop_thread = run_answering(service.tick(), recording, answered)
    assert len(seen) == 1
    settle_thread, loop_answered = seen[0]
    assert loop_answered and settle_thread != loop_thread
    runtime = service.runtime("chat")
    assert runtime is not None and runtime.decision is not None  # the status the thread built is the one shown
    assert len(store.list_decisions()) == 1
    assert registry.get_sample_value("moeslo_sli", {"policy": "chat", "sli": "queue_depth"}) == 0.0
