"""The warm start's history: resampled onto the tick grid, with a gap the live forecaster would not fill left out."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path

from controller.core import DecisionCore
from controller.load_history import LOAD_HISTORY_CHUNK_S, LoadHistoryKeeper, resample
from controller.policy import LocalTarget, Policy
from controller.store import Store, StoredPolicy
from controller.types import LoadHistory, PolicyObservation
from tests.controller.loop_answers import run_answering

BIN_S = 15.0
DAY_S = 86_400.0


def samples(times: list[float]) -> list[list[float]]:
    return [[t, t / BIN_S, 10.0, 5.0] for t in times]


def test_a_gap_longer_than_the_fill_limit_drops_what_came_before_it() -> None:
    """As the live forecaster restarts after a gap it does not fill, the warm start keeps only the bins after it."""
    rows = samples([0.0, 15.0, 90.0, 105.0])  # bins 0, 1, then 4 missed, then 6, 7
    assert list(resample(rows, bin_s=BIN_S, max_fill_bins=4).rates_rps) == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 6.0, 7.0]
    assert list(resample(rows, bin_s=BIN_S, max_fill_bins=3).rates_rps) == [6.0, 7.0]


def test_a_gap_up_to_now_longer_than_the_fill_limit_seeds_nothing() -> None:
    rows = samples([0.0, 15.0])
    assert list(resample(rows, bin_s=BIN_S, until_s=75.0, max_fill_bins=4).rates_rps) == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert len(resample(rows, bin_s=BIN_S, until_s=90.0, max_fill_bins=4)) == 0


class Seeds(DecisionCore):
    """A core that keeps what the keeper seeds it with."""

    def __init__(self) -> None:
        super().__init__()
        self.seeded: dict[str, LoadHistory] = {}

    def warm_start(self, policy: Policy, history: LoadHistory) -> int:
        self.seeded[policy.name] = history
        return 1


def _warm_start(tmp_path: Path, times: list[float], now_s: float) -> tuple[Seeds, LoadHistoryKeeper]:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    store.save_load_history([("p", 0.0, samples(times))])
    keeper = LoadHistoryKeeper(store, bin_s=BIN_S, keep_s=14 * DAY_S, wall_clock=lambda: now_s)
    created = datetime.fromtimestamp(0.0, UTC)
    stored = StoredPolicy(Policy(name="p", target=LocalTarget()), 1, created, created)
    core = Seeds()
    asyncio.run(keeper.warm_start(core, [stored]))
    return core, keeper


def test_a_controller_down_longer_than_a_season_starts_its_forecaster_afresh(tmp_path: Path) -> None:
    """Down 30 h after two days: the warm start made up the 30 h as the last value, which a daily model then
    repeated as the forecast where the load was back on its daily curve."""
    two_days = [k * BIN_S for k in range(int(2 * DAY_S / BIN_S))]
    core, keeper = _warm_start(tmp_path, two_days, now_s=2 * DAY_S + 30 * 3600.0)
    assert "p" not in core.seeded and keeper.warmed["p"] == ("store", 0)


def test_a_controller_down_less_than_a_season_fills_the_gap(tmp_path: Path) -> None:
    two_days = [k * BIN_S for k in range(int(2 * DAY_S / BIN_S))]
    core, _ = _warm_start(tmp_path, two_days, now_s=2 * DAY_S + 3600.0)
    assert len(core.seeded["p"]) == int((2 * DAY_S + 3600.0) / BIN_S)


def test_the_warm_start_keeps_only_the_history_after_a_gap_longer_than_a_season(tmp_path: Path) -> None:
    before, after = [k * BIN_S for k in range(100)], [2 * DAY_S + k * BIN_S for k in range(100)]
    core, _ = _warm_start(tmp_path, before + after, now_s=2 * DAY_S + 100 * BIN_S)
    assert list(core.seeded["p"].rates_rps) == [t / BIN_S for t in after]


def test_a_follower_holds_only_each_policys_current_chunk(tmp_path: Path) -> None:
    """A follower records every tick but writes nothing: it kept every hourly chunk it ever recorded.  It keeps
    only the current one, which it writes once promoted."""
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    clock = [1_700_000_000.0]
    keeper = LoadHistoryKeeper(store, bin_s=BIN_S, keep_s=14 * DAY_S, wall_clock=lambda: clock[0])
    names = ["p0", "p1", "p2"]
    observed = {
        name: PolicyObservation(policy=name, observed_at_s=0.0, request_rate_rps=1.0, prompt_tokens_per_s=1.0,
                                output_tokens_per_s=1.0)
        for name in names
    }  # fmt: skip

    async def follow(ticks: int) -> None:
        for _ in range(ticks):
            keeper.record(observed)
            await keeper.after_tick(leader=False, policies=names)
            clock[0] += BIN_S

    asyncio.run(follow(int(2 * DAY_S / BIN_S)))
    keeper.record(observed)
    for _ in range(keeper.flush_every_ticks):  # promoted: the next flush writes what it holds
        asyncio.run(keeper.after_tick(leader=True, policies=names))
    current = clock[0] - clock[0] % LOAD_HISTORY_CHUNK_S
    for name in names:
        assert {s[0] - s[0] % LOAD_HISTORY_CHUNK_S for s in store.load_history(name, since_s=0)} == {current}


def test_a_warm_start_the_forecaster_ignored_is_not_reported_as_seeded(tmp_path: Path) -> None:
    """A warm start that ran late (after the policy's first live tick) is ignored by the forecaster, and status
    said it held "200 ticks from the store" where it held only its live bins."""
    from tests.controller.test_predictive_gaps import POLICY, advisor, observe

    predictive = advisor()
    core = DecisionCore([predictive])
    predictive.assess(POLICY, observe(0.0), 0.0)  # the policy's first live tick
    now = 1_700_000_000.0
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    store.save_load_history([("p", now - now % 3600 - 3600, [[now - 3600 + BIN_S * k, 5.0, 500.0, 250.0]
                                                            for k in range(200)])])  # fmt: skip
    keeper = LoadHistoryKeeper(store, bin_s=BIN_S, keep_s=3 * DAY_S, wall_clock=lambda: now)
    created = datetime.fromtimestamp(0.0, UTC)
    asyncio.run(keeper.warm_start(core, [StoredPolicy(POLICY, 1, created, created)]))
    assert predictive.history_bins("p") == 1
    assert keeper.warmed["p"] == ("store", 0)  # status: "none"


def test_the_event_loop_answers_while_a_warm_start_seeds_the_core(tmp_path: Path) -> None:
    """Seeding a forecaster (~80 ms a policy with two weeks of history) waits for a coroutine on the loop to run:
    on the loop itself it would wait in vain."""
    seeding, answered = threading.Event(), threading.Event()
    seen: list[tuple[str, bool]] = []

    class WaitsForTheLoop(Seeds):
        def warm_start(self, policy: Policy, history: LoadHistory) -> int:
            seeding.set()
            seen.append((threading.current_thread().name, answered.wait(timeout=2.0)))
            return super().warm_start(policy, history)

    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    store.save_load_history([("p", 0.0, samples([k * BIN_S for k in range(50)]))])
    keeper = LoadHistoryKeeper(store, bin_s=BIN_S, keep_s=14 * DAY_S, wall_clock=lambda: 50 * BIN_S)
    created = datetime.fromtimestamp(0.0, UTC)
    core = WaitsForTheLoop()
    stored = StoredPolicy(Policy(name="p", target=LocalTarget()), 1, created, created)
    loop_thread = run_answering(keeper.warm_start(core, [stored]), seeding, answered)
    assert len(seen) == 1 and seen[0][1] and seen[0][0] != loop_thread
    assert len(core.seeded["p"].rates_rps) == 50 and keeper.warmed["p"] == ("store", 50)


def test_a_warm_start_cut_off_records_the_policy_it_seeded_and_those_it_did_not_reach(tmp_path: Path) -> None:
    """The tick's time limit cuts the warm start off while it seeds the first of two policies.  That seed runs to
    its end, and status said "none" for it; the second, observed live that same tick, was said to be warm-started
    at a later tick, where its forecaster then refused the history for good."""
    release = threading.Event()

    class SlowFirstSeed(Seeds):
        def warm_start(self, policy: Policy, history: LoadHistory) -> int:
            release.wait(timeout=5.0)
            return super().warm_start(policy, history)

    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    store.save_load_history([(name, 0.0, samples([k * BIN_S for k in range(50)])) for name in ("a", "b")])
    keeper = LoadHistoryKeeper(store, bin_s=BIN_S, keep_s=14 * DAY_S, wall_clock=lambda: 50 * BIN_S)
    created = datetime.fromtimestamp(0.0, UTC)
    stored = [StoredPolicy(Policy(name=name, target=LocalTarget()), 1, created, created) for name in ("a", "b")]
    core = SlowFirstSeed()

    async def cut_off() -> bool:
        task = asyncio.ensure_future(keeper.warm_start(core, stored))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.sleep(0.1)
        release.set()  # the seed under way finishes after the cancellation
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(cut_off())
    assert list(core.seeded) == ["a"]
    assert keeper.warmed == {"a": ("store", 50), "b": ("", 0)}
