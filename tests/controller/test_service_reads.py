"""The tick's reads are bounded: a source or a replica count that never answers is this tick's error for the
policies it concerns, and the loop goes on; until a first tick succeeds, the service says since when it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from controller.actuators import DryRunActuator, ReplicaCount
from controller.core import DecisionCore
from controller.load_history import LoadHistoryKeeper
from controller.policy import Policy
from controller.store import StoredPolicy
from controller.types import PolicyObservation
from tests.controller.test_service import OVERLOADED, Clock, ScriptedSource, _policy, _service


class NeverAnswers(ScriptedSource):
    """A source whose read never ends (what nothing below it bounds: a reply trickled a byte at a time)."""

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        await asyncio.Event().wait()
        raise AssertionError("never answers")


class CountNeverComes(DryRunActuator):
    """Policy "a"'s replica count never comes (an API server that stalls for one workload)."""

    async def replicas(self, policy: Policy) -> ReplicaCount:
        if policy.name == "a":
            await asyncio.Event().wait()
        return await super().replicas(policy)


class WarmStartNeverEnds(LoadHistoryKeeper):
    """A warm start whose history read never ends."""

    async def warm_start(self, core: DecisionCore, stored: Sequence[StoredPolicy]) -> None:
        await asyncio.Event().wait()


def test_a_warm_start_that_never_ends_leaves_the_forecaster_cold_and_the_tick_decides(tmp_path: Path) -> None:
    service, store, _ = _service(tmp_path, Clock())
    service.read_timeout_s = 0.2
    service.history = WarmStartNeverEnds(store, bin_s=15.0, keep_s=3600.0)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    effects = asyncio.run(asyncio.wait_for(service.tick(), 5.0))
    assert effects is not None and [d.action for d in effects.decisions] == ["scale_up"]


def test_a_source_that_never_answers_is_this_ticks_source_error_and_the_tick_ends(tmp_path: Path) -> None:
    clock = Clock()
    service, store, _ = _service(tmp_path, clock, source=NeverAnswers(clock))
    service.read_timeout_s = 0.2
    store.create_policy(_policy())
    effects = asyncio.run(asyncio.wait_for(service.tick(), 5.0))
    assert effects is not None and [d.action for d in effects.decisions] == ["hold"]
    runtime = service.runtime("chat")
    assert runtime is not None and runtime.stale
    assert runtime.errors == ["scrape source: no complete answer within 0.2 s"]
    assert service.last_tick_at is not None


def test_a_replica_count_that_never_comes_holds_only_its_own_policy(tmp_path: Path) -> None:
    actuator = CountNeverComes()
    service, store, _ = _service(tmp_path, Clock(), actuator=actuator)
    service.read_timeout_s = 0.2
    store.create_policy(_policy("a"))
    store.create_policy(_policy("b"))
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    effects = asyncio.run(asyncio.wait_for(service.tick(), 5.0))
    assert effects is not None
    assert actuator.calls == [("b", 3)]
    runtime = service.runtime("a")
    assert runtime is not None and runtime.errors == ["dryrun replica count: no complete answer within 0.2 s"]


def test_the_service_says_when_it_started(tmp_path: Path) -> None:
    """``/v1/status`` counts ``tick_overdue`` from here while no tick has succeeded (a first tick that hangs)."""
    started = datetime(2026, 1, 1, tzinfo=UTC)
    service, _, _ = _service(tmp_path, Clock(), source=NeverAnswers(Clock()))
    service.wall_clock = lambda: started

    async def run() -> datetime | None:
        assert service.started_at is None
        await service.start()
        try:
            return service.started_at
        finally:
            await service.stop()

    assert asyncio.run(run()) == started
