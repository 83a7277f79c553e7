"""The live rebalancer's steps against an in-memory engine: apply, advisory, failure, verification."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from contracts.errors import UnavailableError
from contracts.imbalance import imbalance_cv, rank_load
from contracts.placement import Placement
from controller.actuators.placement import ExpertLoadSnapshot, Rebalancer
from controller.policy import ImbalanceObjective, LocalTarget, Mode, Objectives, Policy
from controller.rebalance import TriggerSettings

# Two hot experts (0 and 1) that the contiguous placement puts on the same rank.
LOAD = np.array([[400, 300, 10, 10, 10, 10, 10, 10]], dtype=np.int64)


class InMemoryEngine:
    """An engine whose measured CV follows its placement under a fixed load."""

    def __init__(self, *, fail_apply: bool = False) -> None:
        self.placement = Placement.contiguous(1, 8, 2)
        self.applied: list[Placement] = []
        self.fail_apply = fail_apply

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        ranks = rank_load(self.placement.phy2log, LOAD.astype(float), self.placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=LOAD, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=self.placement)

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        if self.fail_apply:
            raise UnavailableError("engine went away")
        self.applied.append(placement)
        self.placement = placement
        return {"experts_moved": 2, "duration_s": 0.01}


def _policy(mode: Mode) -> Policy:
    return Policy(name="p", target=LocalTarget(), mode=mode,
                  objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=10)))


def _run(engine: InMemoryEngine, mode: Mode, times: list[float]) -> list[Any]:
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)

    async def ticks() -> list[Any]:
        events = []
        for now in times:
            events += await rebalancer.tick(_policy(mode), ["http://engine"], now)
        return events

    return asyncio.run(ticks())


def test_sustained_imbalance_is_rebalanced_then_verified() -> None:
    engine = InMemoryEngine()
    events = _run(engine, Mode.ENFORCE, [0, 5, 11, 20, 30])
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "applied"), ("verify", "verified")]
    applied = events[0]
    assert applied.decision.reason == "rebalance" and applied.swap == {"experts_moved": 2, "duration_s": 0.01}
    assert applied.plan["imbalance_before_cv"] > 0.15 > applied.plan["imbalance_after_cv"]
    assert len(engine.applied) == 1
    assert events[1].verify.measured_cv < 0.15


def test_advisory_mode_logs_the_plan_without_applying_it() -> None:
    engine = InMemoryEngine()
    events = _run(engine, Mode.ADVISORY, [0, 5, 11, 20, 30])
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "advisory")]
    assert engine.applied == [] and engine.placement == Placement.contiguous(1, 8, 2)


def test_a_failed_apply_is_reported_and_not_verified() -> None:
    engine = InMemoryEngine(fail_apply=True)
    events = _run(engine, Mode.ENFORCE, [0, 5, 11, 20, 30])
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "failed")]
    assert "engine went away" in events[0].error


def test_off_mode_and_short_violations_do_nothing() -> None:
    assert _run(InMemoryEngine(), Mode.OFF, [0, 5, 11, 20]) == []
    assert _run(InMemoryEngine(), Mode.ENFORCE, [0, 5]) == []  # not sustained for 10 s yet
