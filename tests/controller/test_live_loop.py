"""The live loop: the service runs the replay's core, forecasts, and keeps its load history across restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from controller.capacity import DEFAULT_PROFILE
from controller.config import ControllerSettings
from controller.load_history import LoadHistoryRecorder, resample
from controller.policy import KubernetesTarget, Policy
from controller.replay.strategies import CoreStrategy, production_core
from controller.service import ControllerService, build_service
from controller.store import Store
from controller.types import PolicyObservation, SliSnapshot, TickInput

TICK_S = 15.0


def sequence(n: int, seed: int = 1) -> list[tuple[float, float, float, int, float]]:
    """(rate, prompt tokens/s, output tokens/s, replicas, queue) per tick: a noisy daily-like rise."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        rate = rng.poisson((4.0 + 6.0 * k / n) * TICK_S) / TICK_S
        out.append((rate, rate * 900.0, rate * 250.0, 2 + k // 60, float(rng.integers(0, 3))))
    return out


def test_the_forecasters_keep_the_history_the_service_reads_back(tmp_path: Path) -> None:
    keeps = []
    for days in (3, 30):
        settings = ControllerSettings(db=str(tmp_path / f"{days}.db"), tick_interval_s=TICK_S,
                                      forecast_history_s=days * 86_400.0)  # fmt: skip
        service = build_service(settings, Store(settings.db_url), CollectorRegistry())
        keeps.append(service.core.advisors[0].predictive.config.forecast.keep_s)  # type: ignore[attr-defined]
    assert keeps == [14 * 86_400.0, 30 * 86_400.0]  # two weeks at least; a month read back is kept


def test_service_and_replay_build_the_same_core(tmp_path: Path) -> None:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), tick_interval_s=TICK_S)
    service = build_service(settings, Store(settings.db_url), CollectorRegistry())
    strategy = CoreStrategy.for_replay(
        production_core(profile=DEFAULT_PROFILE, tick_s=TICK_S, refit_every_ticks=240, season_s=86_400.0),
        lead_time_s=120, cooldown_s=180, max_replicas=50, quantile=0.9,
    )  # fmt: skip
    policy = strategy.policy
    decisions = []
    for k, (rate, prompt, output, replicas, queue) in enumerate(sequence(300)):
        now = 100.0 + k * TICK_S
        obs = PolicyObservation(
            policy=policy.name, observed_at_s=now, current_replicas=replicas, ready_replicas=replicas,
            queue_depth=queue, running_requests=10.0, request_rate_rps=rate, prompt_tokens_per_s=prompt,
            output_tokens_per_s=output, kv_cache_usage=0.4,
            sli=SliSnapshot(observed_at_s=now, requests_in_window=500.0, ttft_good_ratio=0.999,
                            itl_good_ratio=0.995, ttft_p99_s=0.3, itl_p99_s=0.018),
        )
        tick = TickInput(now_s=now, policies={policy.name: policy}, observations={policy.name: obs})
        ours = service.core.tick(tick).for_policy(policy.name)
        theirs = strategy.core.tick(tick).for_policy(policy.name)
        decisions.append((ours.action, ours.desired_replicas, ours.reasons))
        assert (ours.action, ours.desired_replicas, ours.reasons) == (theirs.action, theirs.desired_replicas,
                                                                      theirs.reasons), k
        assert ours.forecast == theirs.forecast
    assert any("forecast" in reasons for _, _, reasons in decisions)  # the forecast sized the fleet


class RateSource:
    """The same load every tick, from a fixed script."""

    def __init__(self, script: Sequence[tuple[float, float, float, int, float]]) -> None:
        self.script = list(script)
        self.k = 0

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        rate, prompt, output, _, queue = self.script[min(self.k, len(self.script) - 1)]
        self.k += 1
        return {p.name: PolicyObservation(
            policy=p.name, observed_at_s=now_s, request_rate_rps=rate, prompt_tokens_per_s=prompt,
            output_tokens_per_s=output, queue_depth=queue, running_requests=5.0, kv_cache_usage=0.3,
        ) for p in policies}

    async def aclose(self) -> None:
        return None


def _service(
    tmp_path: Path, wall: list[float], script: Sequence[tuple[float, float, float, int, float]]
) -> tuple[ControllerService, Store]:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), tick_interval_s=TICK_S)
    store = Store(settings.db_url)
    service = build_service(settings, store, CollectorRegistry())
    service.source = RateSource(script)
    service.clock = lambda: wall[0]
    service.wall_clock = lambda: datetime.fromtimestamp(wall[0], UTC)
    assert service.history is not None
    service.history.wall_clock = lambda: wall[0]
    return service, store


def test_a_restart_keeps_the_forecast_history(tmp_path: Path) -> None:
    wall = [0.0]
    script = sequence(80)
    service, store = _service(tmp_path, wall, script)
    target = KubernetesTarget(kind="deployment", namespace="ns", name="p")
    created = store.create_policy(Policy(name="p", target=target))
    wall[0] = created.created_at.timestamp()  # the store reads back what was recorded since the policy's creation

    async def run(ticks: int) -> None:
        for _ in range(ticks):
            await service.tick()
            wall[0] += TICK_S

    asyncio.run(run(60))
    before = service.runtime("p")
    assert before is not None and before.forecast is not None
    assert before.forecast["history_s"] >= 55 * TICK_S
    wall[0] += 120.0  # the controller is down for two minutes
    restarted, _ = _service(tmp_path, wall, script)
    service = restarted
    asyncio.run(run(1))
    after = service.runtime("p")
    assert after is not None and after.forecast is not None
    # Warm-started from the store: 60 ticks of history plus the 8 bins it was down (filled forward).
    assert after.forecast["history_s"] >= 60 * TICK_S
    assert after.seen["history_warm_start"].endswith("ticks from the store")
    assert "warming_up" not in after.decision["reasons"]  # type: ignore[index]


def test_resample_fills_gaps_forward_on_the_tick_grid() -> None:
    samples = [[0.0, 1.0, 10.0, 5.0], [15.0, 2.0, 20.0, 6.0], [61.0, 4.0, 40.0, 8.0]]
    history = resample(samples, bin_s=15.0, until_s=90.0)
    assert list(history.rates_rps) == [1.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0]
    assert list(history.prompt_tokens_per_s)[-1] == 40.0


def test_the_recorder_writes_hourly_chunks(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}")
    recorder = LoadHistoryRecorder()
    start = 1_700_000_000.0 - 1_700_000_000.0 % 3600
    for k in range(300):
        recorder.record("p", start + k * TICK_S, float(k), 1.0, 2.0)
    chunks = recorder.dirty_chunks()
    assert [(c[0], c[1], len(c[2])) for c in chunks] == [("p", start, 240), ("p", start + 3600, 60)]
    store.save_load_history(chunks)
    recorder.record("p", start + 300 * TICK_S, 300.0, 1.0, 2.0)
    store.save_load_history(recorder.dirty_chunks())  # the current chunk is rewritten whole
    samples = store.load_history("p", since_s=start)
    assert [s[1] for s in samples] == [float(k) for k in range(301)]
    assert store.prune_load_history(before_s=start + 1, keep_policies=["p"]) == 1
    assert len(store.load_history("p", since_s=0.0)) == 61


def test_the_keeper_records_the_offered_load_refusals_included(tmp_path: Path) -> None:
    from controller.load_history import LoadHistoryKeeper
    from controller.types import PolicyObservation

    keeper = LoadHistoryKeeper(Store(f"sqlite+pysqlite:///{tmp_path / 'h.db'}"), bin_s=TICK_S, keep_s=3600.0,
                               wall_clock=lambda: 1_700_000_000.0)  # fmt: skip
    served = PolicyObservation(policy="p", observed_at_s=0.0, request_rate_rps=10.0, prompt_tokens_per_s=5000.0,
                               output_tokens_per_s=1000.0)  # fmt: skip
    keeper.record({"p": replace(served, router_refused_rps=5.0), "q": replace(served, policy="q"),
                   "r": replace(served, policy="r", request_rate_rps=None)})  # fmt: skip
    chunks = {policy: samples for policy, _, samples in keeper.recorder.dirty_chunks()}
    assert chunks["p"] == [[1_700_000_000.0, 15.0, 7500.0, 1500.0]]  # 5 refused at the served lengths
    assert chunks["q"] == [[1_700_000_000.0, 10.0, 5000.0, 1000.0]]
    assert "r" not in chunks  # no rates, nothing recorded
