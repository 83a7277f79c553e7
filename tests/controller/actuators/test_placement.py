"""The live rebalancer's steps against an in-memory engine: apply, advisory, failure, verification."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

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
    before, after = applied.plan["imbalance_before_cv"], applied.plan["imbalance_after_cv"]
    assert applied.detail() == f"http://engine: predicted worst-layer CV {before:.3f} -> {after:.3f}, 2 expert moves"
    assert events[1].detail().endswith(f"; expected {after:.3f}, measured {events[1].verify.measured_cv:.3f}")


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


def test_the_planner_runs_only_when_the_trigger_needs_the_plans_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sustain and cooldown are judged before planning: a violating tick inside either plans nothing (every apply
    failing, each plan used to be thrown away until the cooldown ran out)."""
    import controller.actuators.placement as actuator

    plans: list[int] = []
    timed_plan = actuator._timed_plan

    def counting(windows: list[np.ndarray], placement: Placement) -> Any:
        plans.append(len(windows))
        return timed_plan(windows, placement)

    monkeypatch.setattr(actuator, "_timed_plan", counting)
    events = _run(InMemoryEngine(fail_apply=True), Mode.ENFORCE, [float(t) for t in range(0, 300, 5)])
    assert [e.outcome for e in events] == ["failed", "failed", "failed"]  # at 10 s, 110 s and 210 s
    assert len(plans) == 3


class OneBrokenEngine(InMemoryEngine):
    """Every endpoint but ``http://broken`` is an in-memory engine; that one's reads raise an unexpected error."""

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        if endpoint == "http://broken":
            raise ValueError("operands could not be broadcast together")
        return await super().expert_load(endpoint)


def test_one_engines_error_leaves_the_other_engines_steps_to_report(caplog: pytest.LogCaptureFixture) -> None:
    """An error on one engine used to abort the tick: the engine rebalanced before it lost its 'applied' step."""
    engine = OneBrokenEngine()
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)

    async def ticks() -> list[Any]:
        events = []
        for now in (0.0, 5.0, 11.0):
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://a", "http://broken"], now)
        return events

    events = asyncio.run(ticks())
    assert [(e.endpoint, e.outcome) for e in events] == [("http://a", "applied")]
    assert len(engine.applied) == 1
    assert "http://broken" in caplog.text and "operands could not be broadcast" in caplog.text


# Two hot sets that alternate every 10 s; a placement from one window alone leaves the other unbalanced.
HOT_A = np.full((1, 16), 500, dtype=np.int64)
HOT_A[0, :4] = 10_000
HOT_B = np.full((1, 16), 500, dtype=np.int64)
HOT_B[0, [4, 5, 8, 9]] = 10_000


class DriftingEngine(InMemoryEngine):
    """Its routing window holds hot set A for 10 s, then B for 10 s, and so on."""

    def __init__(self) -> None:
        super().__init__()
        self.placement = Placement.contiguous(1, 16, 4)
        self.now_s = 0.0

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        load = HOT_A if int(self.now_s // 10) % 2 == 0 else HOT_B
        ranks = rank_load(self.placement.phy2log, load.astype(float), self.placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=load, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=self.placement)


def _drift(history_windows: int) -> tuple[list[Any], list[float]]:
    engine = DriftingEngine()
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=25), verify_after_s=5,
                            history_windows=history_windows, window_every_s=10)

    async def ticks() -> tuple[list[Any], list[float]]:
        events, cvs = [], []
        for now in range(0, 100, 5):
            engine.now_s = float(now)
            cvs.append(max((await engine.expert_load("x")).imbalance_cv))
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], float(now))
        return events, cvs

    return asyncio.run(ticks())


def test_a_plan_from_the_history_holds_when_the_hot_set_drifts() -> None:
    events, cvs = _drift(history_windows=4)
    applied = [e for e in events if e.kind == "rebalance"]
    assert len(applied) == 1 and applied[0].plan["windows"] == 3
    decision = applied[0].decision
    # Judged out of sample: a plan without the latest window (A), scored on it.
    assert decision.prediction == "held_out" and decision.predicted_cv_after < 0.05
    after = cvs[cvs.index(0.0):]
    assert len(after) >= 10 and max(after) < 0.05  # both hot sets stay balanced
    # Two windows were not enough: a plan from A alone does not balance B, so the trigger held then.
    assert applied[0].plan["held_out"]["worst_cv_before"] > 0.15


def test_the_verification_line_shows_the_prediction_it_was_judged_on() -> None:
    """The verification dropped the held-out pair: its line read "predicted 0.463 -> 0.015; expected 0.090,
    measured 0.098", the in-sample prediction next to the held-out one it was judged on, as if a miss."""
    events, _ = _drift(history_windows=4)
    applied, verified = (next(e for e in events if e.kind == kind) for kind in ("rebalance", "verify"))
    assert verified.plan == applied.plan and "held_out" in verified.plan
    assert "on a window it was not planned from" in verified.detail()
    assert verified.verify.predicted_cv == pytest.approx(verified.plan["held_out"]["worst_cv_after"])


def test_a_plan_from_the_last_window_alone_does_not_hold() -> None:
    events, cvs = _drift(history_windows=1)
    assert events[0].kind == "rebalance" and events[0].decision.prediction == "in_sample"
    first = cvs.index(0.0)
    assert max(cvs[first:]) > 0.5  # the next phase's hot set lands on one rank again


def test_with_min_windows_the_first_plan_waits_for_a_held_out_prediction() -> None:
    engine = InMemoryEngine()
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5, window_every_s=10,
                            min_windows=2)

    async def ticks() -> list[Any]:
        events = []
        for now in (0, 5, 9, 11, 16, 22):
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], float(now))
        return events

    events = asyncio.run(ticks())
    applied = [e for e in events if e.kind == "rebalance"]
    assert len(applied) == 1  # sustained since 0 s, but planned only once a second window began (10 s)
    assert applied[0].plan["windows"] == 2 and applied[0].decision.prediction == "held_out"
    assert len(engine.applied) == 1


class CountingEngine(InMemoryEngine):
    """Routes one batch between readings; reports a sliding window of the last three batches, and its totals."""

    def __init__(self, batches: list[np.ndarray], *, totals: bool = True) -> None:
        super().__init__()
        self.batches, self.totals = batches, totals
        self.seen: list[np.ndarray] = []

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        self.seen.append(self.batches[min(len(self.seen), len(self.batches) - 1)])
        window = np.sum(self.seen[-3:], axis=0)
        ranks = rank_load(self.placement.phy2log, window.astype(float), self.placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=window, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=self.placement,
                                  expert_tokens_total=np.sum(self.seen, axis=0) if self.totals else None)


@pytest.mark.parametrize("totals", [True, False])
def test_the_held_out_window_shares_no_token_with_the_plan(totals: bool) -> None:
    """With the engine's totals the trigger judges a plan on the load routed since the previous window
    alone; from the sliding window, which still holds the load the plan was made from, it cannot."""
    from controller.rebalance.out_of_sample import held_out_gain

    latest = np.array([[300, 400, 10, 10, 10, 10, 10, 200]], dtype=np.int64)
    engine = CountingEngine([LOAD, latest], totals=totals)
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), window_every_s=10, min_windows=2)

    async def ticks() -> list[Any]:
        events = []
        for now in (0, 10):
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], float(now))
        return events

    applied = [e for e in asyncio.run(ticks()) if e.kind == "rebalance"]
    assert len(applied) == 1 and applied[0].decision.prediction == "held_out"
    contiguous = Placement.contiguous(1, 8, 2).phy2log
    on_latest = held_out_gain(contiguous, contiguous, latest, 2).worst_before
    predicted = applied[0].decision.predicted_cv_before
    assert (predicted == pytest.approx(on_latest)) is totals
    held_out = applied[0].plan["held_out"]
    assert (f"({held_out['worst_cv_before']:.3f} -> {held_out['worst_cv_after']:.3f} on a window it was not "
            "planned from)") in applied[0].detail()


class SwappingEngine(InMemoryEngine):
    """Fifty times the load, and 400 tokens move from one hot expert to the other every other read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        self.reads += 1
        load = LOAD * 50
        if self.reads % 2 == 0:
            load[0, 0] -= 400
            load[0, 1] += 400
        ranks = rank_load(self.placement.phy2log, load.astype(float), self.placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=load, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=self.placement)


def test_verification_widens_its_noise_by_the_windows_dispersion() -> None:
    """Windows whose rank shares move more than independent draws explain widen the verification's noise;
    identical windows leave it as it was."""
    steady = _run(InMemoryEngine(), Mode.ENFORCE, [0, 5, 11, 20, 30])[1].verify
    assert steady.noise_dispersion == 1.0
    engine = SwappingEngine()
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5, window_every_s=4)

    async def ticks() -> list[Any]:
        events = []
        for now in (0, 5, 11, 20, 30):
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], float(now))
        return events

    verify = next(e for e in asyncio.run(ticks()) if e.kind == "verify").verify
    assert verify.ok and verify.noise_dispersion > 5
    assert verify.to_json()["noise_dispersion"] == verify.noise_dispersion
    # Fifty times the tokens: the independent-draw floor alone would be sqrt(50) times narrower than steady's.
    assert verify.noise_cv is not None and steady.noise_cv is not None
    assert verify.noise_cv > steady.noise_cv / 50**0.5 * 2


class LargeSkewedEngine(InMemoryEngine):
    """DeepSeek-V3's shape (58 MoE layers, 256 experts on 32 ranks of 9 slots), with skewed routing."""

    def __init__(self) -> None:
        super().__init__()
        self.placement = Placement.contiguous(58, 256, 32, 9)
        self.load = np.random.default_rng(0).zipf(1.6, size=(58, 256)).clip(max=5000).astype(np.int64)

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        ranks = rank_load(self.placement.phy2log, self.load.astype(float), self.placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=self.load, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=self.placement)


def test_planning_leaves_the_event_loop_free() -> None:
    """A plan at DeepSeek-V3's size takes tens of milliseconds or more: the controller's API and its other ticks
    must not wait it out, so it runs off the event loop."""
    engine = LargeSkewedEngine()
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)
    gaps: list[float] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.002)
            now = loop.time()
            gaps.append(now - last)
            last = now

    async def run() -> list[Any]:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeat(stop))
        events = []
        for now in (0.0, 5.0, 11.0):
            events += await rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], now)
        stop.set()
        await beat
        return events

    (event,) = asyncio.run(run())
    assert event.kind == "rebalance" and event.outcome == "applied"
    plan_s = event.plan["plan_ms"] / 1000
    if plan_s < 0.02:
        pytest.skip(f"a plan took {plan_s * 1000:.0f} ms here: too quick to tell a blocked loop from a free one")
    assert gaps, "the event loop never ran while the rebalancer ticked"
    assert max(gaps) < plan_s / 2


class RestartingEngine(InMemoryEngine):
    """Restarted with a model of two MoE layers once the first rebalance was applied (before its verification)."""

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        if not self.applied:
            return await super().expert_load(endpoint)
        load = np.vstack([LOAD, LOAD])
        placement = Placement.contiguous(2, 8, 2)
        ranks = rank_load(placement.phy2log, load.astype(float), placement.num_ranks)
        return ExpertLoadSnapshot(expert_tokens=load, imbalance_cv=tuple(float(x) for x in imbalance_cv(ranks)),
                                  steps_in_window=64, placement=placement)


def test_an_engine_restarted_with_another_model_starts_its_history_afresh() -> None:
    """The plan awaiting verification was the old model's: judging it on the new one raised on every tick."""
    engine = RestartingEngine()
    events = _run(engine, Mode.ENFORCE, [0, 5, 11, 20, 30, 40, 50, 60])
    # The old model's plan is dropped unjudged; the new model is planned (two layers: 4 moves) and judged.
    assert [(e.kind, e.plan["moves"]) for e in events] == [("rebalance", 2), ("rebalance", 4), ("verify", 4)]


def test_an_engine_restarted_with_another_model_is_still_known_as_listed() -> None:
    """Its state made afresh forgot when it was last listed: one listing missed, and it was dropped at once."""
    rebalancer = Rebalancer(RestartingEngine(), TriggerSettings(cooldown_s=100), verify_after_s=5)
    for now in (0.0, 5.0, 11.0, 20.0):  # applied at 11 s; the engine serves two layers from then on
        asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], now))
    assert rebalancer._state[("p", "http://engine")].shape == ((2, 8), (2, 8), 2)
    asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), [], 21.0))
    assert ("p", "http://engine") in rebalancer._state


class RevertingEngine(InMemoryEngine):
    """Takes the placement, then (a restart, or vLLM's own EPLB) runs the contiguous one again."""

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        swap = await super().apply_placement(endpoint, placement)
        self.placement = Placement.contiguous(1, 8, 2)
        return swap


def test_a_plan_whose_placement_the_engine_no_longer_runs_is_superseded_not_judged() -> None:
    events = _run(RevertingEngine(), Mode.ENFORCE, [0, 5, 11, 20])
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "applied"), ("verify", "unverified")]
    assert events[1].verify.reason == "superseded"


class StallingEngine(InMemoryEngine):
    """Applies placements at once on every endpoint but one, whose apply never answers; keeps its own placement."""

    def __init__(self, stalls_on: str) -> None:
        super().__init__()
        self.stalls_on = stalls_on
        self.applying = asyncio.Event()

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        if endpoint == self.stalls_on:
            self.applying.set()
            await asyncio.sleep(60)
        return {"experts_moved": 2, "duration_s": 0.01}


def test_a_cancelled_tick_leaves_its_finished_steps_and_the_apply_it_cut_short_to_report() -> None:
    """A shutdown cancels the tick in an engine's apply: the step applied on the engine before it, and the apply cut
    short (its outcome unknown), must still reach the decision log."""
    engine = StallingEngine(stalls_on="http://b")
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)
    endpoints = ["http://a", "http://b"]

    async def run() -> list[Any]:
        for now_s in (0.0, 5.0):
            assert await rebalancer.tick(_policy(Mode.ENFORCE), endpoints, now_s) == []
        task = asyncio.create_task(rebalancer.tick(_policy(Mode.ENFORCE), endpoints, 11.0))
        await asyncio.wait_for(engine.applying.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return rebalancer.take_unreported()

    events = asyncio.run(run())
    assert [(e.endpoint, e.kind, e.outcome) for e in events] == [
        ("http://a", "rebalance", "applied"), ("http://b", "rebalance", "interrupted"),
    ]
    assert events[1].error == "a shutdown cut the apply short: whether the engine took the placement is unknown"
    assert rebalancer.take_unreported() == []  # reported once


class ApplyRecordingEngine(InMemoryEngine):
    """Records which endpoints a placement was applied on; every endpoint keeps the skewed placement."""

    def __init__(self) -> None:
        super().__init__()
        self.applied_on: list[str] = []

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        self.applied_on.append(endpoint)
        return {"experts_moved": 2, "duration_s": 0.01}


def _warmed(engine: InMemoryEngine, endpoints: list[str]) -> Rebalancer:
    """A rebalancer that has seen the imbalance on ``endpoints`` for 10 s (the next tick, at 11 s, rebalances)."""
    rebalancer = Rebalancer(engine, TriggerSettings(cooldown_s=100), verify_after_s=5)
    for now_s in (0.0, 5.0):
        assert asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), endpoints, now_s)) == []
    return rebalancer


def test_a_lease_lost_after_an_engine_leaves_the_next_engines_to_the_new_leader() -> None:
    engine = ApplyRecordingEngine()
    rebalancer = _warmed(engine, ["http://a", "http://b"])
    events = asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), ["http://a", "http://b"], 11.0,
                                         still_leading=lambda: not engine.applied_on))  # fmt: skip
    assert [(e.endpoint, e.outcome) for e in events] == [("http://a", "applied")]
    assert engine.applied_on == ["http://a"]


def test_a_lease_lost_while_the_plan_was_made_applies_nothing() -> None:
    engine = InMemoryEngine()
    rebalancer = _warmed(engine, ["http://engine"])
    leading = iter([True, False])  # before the engine's read, and before its apply
    assert asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], 11.0,
                                       still_leading=lambda: next(leading))) == []  # fmt: skip
    assert engine.applied == []
    # Nothing was marked done: leading again, it rebalances at once (no cooldown began).
    [event] = asyncio.run(rebalancer.tick(_policy(Mode.ENFORCE), ["http://engine"], 12.0))
    assert (event.kind, event.outcome) == ("rebalance", "applied") and len(engine.applied) == 1
