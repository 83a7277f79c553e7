"""A replica added to a policy's fleet plans its first rebalance on a sibling's load history."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from contracts.errors import UnavailableError
from contracts.imbalance import imbalance_cv, rank_load
from contracts.placement import Placement
from controller.actuators.placement import ExpertLoadSnapshot, Rebalancer
from controller.policy import Mode
from controller.rebalance import TriggerSettings
from tests.controller.actuators.test_placement import InMemoryEngine, _policy

A, B = "http://a", "http://b"


class Fleet:
    """One in-memory engine per endpoint (the same model and traffic); ``down``: these fail to answer."""

    def __init__(self) -> None:
        self.engines = {A: InMemoryEngine(), B: InMemoryEngine()}
        self.down: set[str] = set()

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        if endpoint in self.down:
            raise UnavailableError(f"{endpoint}: connection refused")
        return await self.engines[endpoint].expert_load(endpoint)

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        return await self.engines[endpoint].apply_placement(endpoint, placement)


def _run(fleet: Fleet, ticks: list[tuple[float, list[str]]], down_after_s: dict[str, float] | None = None) -> list[Any]:
    """Windows 30 s apart, two before a plan: an engine needs 30 s of its own history first.  ``down_after_s``:
    engines that stop answering after that time."""
    rebalancer = Rebalancer(fleet, TriggerSettings(cooldown_s=100), verify_after_s=5, window_every_s=30,
                            min_windows=2)  # fmt: skip

    async def run() -> list[Any]:
        events = []
        for now, endpoints in ticks:
            fleet.down = {endpoint for endpoint, after_s in (down_after_s or {}).items() if now > after_s}
            events += await rebalancer.tick(_policy(Mode.ENFORCE), endpoints, now)
        return events

    return asyncio.run(run())


# A alone until 35 s (two windows, rebalanced at 30 s, verified at 35 s); B added at 40 s.
A_ALONE = [(0.0, [A]), (5.0, [A]), (11.0, [A]), (30.0, [A]), (35.0, [A])]
B_JOINS = [(40.0, [A, B]), (45.0, [A, B]), (51.0, [A, B])]


def test_a_new_replica_plans_on_its_siblings_windows_once_its_imbalance_is_sustained() -> None:
    fleet = Fleet()
    events = _run(fleet, A_ALONE + B_JOINS)
    on_b = [e for e in events if e.endpoint == B]
    assert [(e.kind, e.outcome) for e in on_b] == [("rebalance", "applied")]
    applied = on_b[0]
    assert applied.decision.reason == "rebalance" and applied.decision.prediction == "held_out"
    assert applied.plan["windows_from"] == A and applied.plan["windows"] == 3  # A's two, B's own held out
    assert "planned on http://a's load history" in applied.detail()
    assert fleet.engines[B].placement != Placement.contiguous(1, 8, 2)


def test_without_a_sibling_the_new_replica_waits_for_its_own_windows() -> None:
    fleet = Fleet()
    events = _run(fleet, [(now, [B]) for now, _ in B_JOINS])
    assert events == [] and fleet.engines[B].applied == []


def test_an_engine_no_longer_listed_lends_nothing() -> None:
    """A replica scaled away keeps its state in the rebalancer, but its windows grow old: not lent."""
    fleet = Fleet()
    events = _run(fleet, A_ALONE + [(now, [B]) for now, _ in B_JOINS])
    assert [e for e in events if e.endpoint == B] == [] and fleet.engines[B].applied == []


class MixedFleet(Fleet):
    """B's traffic uses other experts than A's (an entry that splits tenants by prefix): A's hot experts are 0 and
    1, B's 6 and 7."""

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        snap = await super().expert_load(endpoint)
        if endpoint != B:
            return snap
        load = snap.expert_tokens[:, ::-1].copy()
        engine = self.engines[B]
        cv = imbalance_cv(rank_load(engine.placement.phy2log, load.astype(float), engine.placement.num_ranks))
        return ExpertLoadSnapshot(expert_tokens=load, imbalance_cv=tuple(float(x) for x in cv), steps_in_window=64,
                                  placement=engine.placement)  # fmt: skip


def test_a_borrowed_plan_is_judged_on_the_new_replicas_own_routing() -> None:
    """B's own newest window is held out: a plan for A's hot experts that does nothing for B's is not applied
    (judged on A's window, it was, and measured no better)."""
    fleet = MixedFleet()
    events = _run(fleet, A_ALONE + B_JOINS)
    on_b = [e for e in events if e.endpoint == B]
    assert on_b == [] and fleet.engines[B].applied == []
    assert [(e.endpoint, e.kind) for e in events if e.kind == "rebalance"] == [(A, "rebalance")]


def test_an_engine_that_stopped_answering_lends_nothing() -> None:
    """A's reads fail for an hour: its windows are an hour old, not lent."""
    fleet = Fleet()
    events = _run(fleet, [*A_ALONE, *((now + 3600, [A, B]) for now, _ in B_JOINS)], down_after_s={A: 3600})
    assert [e for e in events if e.endpoint == B] == [] and fleet.engines[B].applied == []


def test_engines_scaled_away_and_deleted_policies_are_forgotten() -> None:
    """Each pod address seen kept its windows for good; a policy created again under its name lent its old ones."""
    fleet = Fleet()
    rebalancer = Rebalancer(fleet, TriggerSettings(cooldown_s=100), window_every_s=30)
    policy = _policy(Mode.ENFORCE)

    async def tick(now: float, endpoints: list[str]) -> None:
        await rebalancer.tick(policy, endpoints, now)

    asyncio.run(tick(0.0, [A, B]))
    assert {key[1] for key in rebalancer._state} == {A, B}
    asyncio.run(tick(250.0, [A]))  # B last read 250 s ago: under ten windows
    assert {key[1] for key in rebalancer._state} == {A, B}
    asyncio.run(tick(301.0, [A]))
    assert {key[1] for key in rebalancer._state} == {A}
    rebalancer.forget(policy.name)
    assert rebalancer._state == {}


class IdleEngine(InMemoryEngine):
    """An engine whose windows carry too few steps to read while ``idle``."""

    idle = False

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        snap = await super().expert_load(endpoint)
        return dataclasses.replace(snap, steps_in_window=0) if self.idle else snap


def test_an_idle_engine_briefly_unlisted_keeps_its_plan_awaiting_verification() -> None:
    """Forgotten by its last reading, A (idle for minutes, then missed by one listing) lost its applied plan, which
    was then never verified."""
    fleet = Fleet()
    fleet.engines[A] = engine = IdleEngine()
    rebalancer = Rebalancer(fleet, TriggerSettings(cooldown_s=100), verify_after_s=5, window_every_s=30,
                            min_windows=2)  # fmt: skip

    async def run() -> list[Any]:
        events = []
        for now, endpoints in [(0.0, [A]), (5.0, [A]), (11.0, [A]), (30.0, [A])]:
            events += await rebalancer.tick(_policy(Mode.ENFORCE), endpoints, now)
        engine.idle = True
        for now, endpoints in [(100.0, [A]), (200.0, [A]), (330.0, [A]), (440.0, []), (445.0, [A])]:
            events += await rebalancer.tick(_policy(Mode.ENFORCE), endpoints, now)
        engine.idle = False
        events += await rebalancer.tick(_policy(Mode.ENFORCE), [A], 450.0)
        return events

    events = asyncio.run(run())
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "applied"), ("verify", "verified")]
