"""The replay harness: deterministic for a seed, drives the production core, policies behave."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.traces import CountTrace, LengthDistribution, RequestTrace
from controller.builder import build_decision_core
from controller.capacity import DEFAULT_PROFILE, CapacityModel, Load, Targets
from controller.core import DecisionCore
from controller.replay.fluid import FluidFleet
from controller.replay.runner import ReplayConfig, ReplayContext, build_strategy, run_setting
from controller.replay.scoring import TickOutcomes, score
from controller.replay.settings import Setting, parse_setting
from controller.replay.signals import FleetView, MetricsPipeline
from controller.replay.strategies import CoreStrategy, OracleStrategy
from controller.replay.workload import make_workload
from controller.replay.world import ProfileCache, World


def step_trace(seed: int = 0) -> RequestTrace:
    """10 minutes at 4 req/s, then 10 minutes at 16 req/s (Poisson), real-ish lengths."""
    rng = np.random.default_rng(seed)
    low = np.cumsum(rng.exponential(1 / 4.0, 2400))
    low = low[low < 600]
    high = 600 + np.cumsum(rng.exponential(1 / 16.0, 20000))
    high = high[high < 1200]
    arrival = np.r_[low, high]
    prompt = rng.integers(200, 2000, len(arrival))
    output = rng.integers(20, 300, len(arrival))
    return RequestTrace("step", arrival, prompt.astype(np.int64), output.astype(np.int64))


def context(world: World | None = None, **config: object) -> ReplayContext:
    world = world or World(startup_s=120.0)
    workload = make_workload(step_trace(), tick_s=15.0, mode="request", world=world)
    return ReplayContext(workload, DEFAULT_PROFILE, ReplayConfig(world=world, warmup_s=0.0, **config))  # type: ignore[arg-type]


def test_replay_is_deterministic_for_a_seed() -> None:
    ctx = context(World(startup_s=120.0, startup_jitter=0.3, seed=4), refit_every_ticks=20)
    for name in ("hpa", "moeslo", "keda-queue"):
        first = run_setting(Setting.of(name), ctx)
        second = run_setting(Setting.of(name), ctx)
        np.testing.assert_array_equal(first.outcomes.good_both, second.outcomes.good_both)
        np.testing.assert_array_equal(first.outcomes.provisioned, second.outcomes.provisioned)


def test_policies_on_a_step() -> None:
    ctx = context(refit_every_ticks=20)
    runs = {name: run_setting(Setting.of(name), ctx) for name in ("static", "oracle", "moeslo", "hpa")}
    oracle, static, ours = runs["oracle"].score(), runs["static"].score(), runs["moeslo"]
    assert oracle.attainment_both >= 0.99
    assert static.attainment_both >= 0.99
    assert oracle.replica_hours < static.replica_hours
    # No forecast sees a 4x step coming: ours orders replicas within a few ticks of it (a minute of
    # scrape and rate window), and the start-up delay decides the rest.
    step_tick = 600 // 15
    provisioned = ours.outcomes.provisioned
    assert provisioned[step_tick + 6] > provisioned[step_tick - 1]
    assert provisioned[-1] >= 2 * provisioned[step_tick - 1]
    assert ours.score().attainment_both >= 0.7
    assert runs["hpa"].outcomes.provisioned[-1] > runs["hpa"].outcomes.provisioned[step_tick - 1]


def test_moeslo_policy_is_the_production_core() -> None:
    ctx = context(refit_every_ticks=20)
    run = run_setting(parse_setting("moeslo:quantile=0.8,cooldown_s=300"), ctx)
    assert run.reasons.get("forecast", 0) > 0  # decisions carried the predictive advisor's reasons
    strategy = build_strategy(Setting.of("moeslo"), ctx)
    assert isinstance(strategy, CoreStrategy)
    assert type(strategy.core) is DecisionCore
    assert [type(a) for a in strategy.core.advisors] == [type(a) for a in build_decision_core().advisors]
    assert strategy.policy.lead_time_s == 120 and strategy.policy.scaling.scale_down_cooldown_s == 180
    assert strategy.policy.forecast.quantile == 0.9


def test_ours_sizing_headroom_is_the_policys_and_trades_hours_for_attainment() -> None:
    """The replay's ``headroom`` knob of ours is the policy's ``scaling.headroom``: a lower one keeps more replicas."""
    ctx = context(refit_every_ticks=20)
    strategy = build_strategy(parse_setting("moeslo:headroom=0.7"), ctx)
    assert isinstance(strategy, CoreStrategy) and strategy.policy.scaling.headroom == 0.7
    low, high = (run_setting(parse_setting(f"moeslo:headroom={h}"), ctx).score() for h in (0.6, 1.0))
    assert low.replica_hours > high.replica_hours


def test_oracle_orders_one_lead_time_ahead() -> None:
    needs = np.array([1, 1, 1, 1, 5, 5, 1, 1], dtype=np.float64)
    oracle = OracleStrategy(needs, lead_ticks=2)
    pipeline = MetricsPipeline(tick_s=15.0, ticks=len(needs))

    def at(k: int) -> FleetView:
        return FleetView(pipeline=pipeline, tick=k, now_s=15.0 * (k + 1), spec_replicas=1, ready_replicas=1)

    # Decided after tick k, for ticks k+1..k+3: the 5s show up two ticks early and leave at once.
    assert [oracle.desired(at(k)) for k in range(len(needs))] == [1, 5, 5, 5, 5, 1, 1, 1]


def test_fluid_fleet_attainment_tracks_capacity() -> None:
    rates = np.full(40, 20.0)
    prompt, output = rates * 1000.0, rates * 150.0
    need = CapacityModel().replicas_needed(
        Load(request_rate_rps=20.0, prompt_tokens_per_s=20000.0, output_tokens_per_s=3000.0)
    )
    truth = ProfileCache(DEFAULT_PROFILE, World(), Targets())
    results = {}
    for replicas in (1, need):
        fleet = FluidFleet(rates, prompt, output, truth, initial_replicas=replicas, tick_s=15)
        for k in range(40):
            fleet.advance((k + 1) * 15.0)
        outcomes = fleet.outcomes(40)
        results[replicas] = float(outcomes.good_both.sum() / outcomes.requests.sum())
    assert results[need] >= 0.99
    assert results[1] < 0.5


def test_a_slower_world_needs_more_replicas_than_the_profile_says() -> None:
    nominal = context().true_needs(0.85)
    slower = context(World(startup_s=120.0, capacity_error=-0.2)).true_needs(0.85)
    assert slower.sum() > nominal.sum() * 1.15


def test_count_trace_workloads() -> None:
    counts = CountTrace("c", 10.0, np.array([100.0, 200.0, 300.0, 400.0]))
    lengths = LengthDistribution.fixed(100, 10)
    fluid = make_workload(counts, tick_s=20.0, mode="fluid", lengths=lengths)
    np.testing.assert_allclose(fluid.rates_rps, [15.0, 35.0])
    np.testing.assert_allclose(fluid.prompt_tokens_per_s, [1500.0, 3500.0])
    request = make_workload(counts, tick_s=20.0, mode="request", lengths=lengths, seed=1)
    assert request.requests is not None and len(request.requests) == 1000


def test_scores_of_a_window() -> None:
    ticks = 480  # two hours of 15 s ticks
    requests = np.full(ticks, 100.0)
    good = requests.copy()
    good[8:12] = 50.0  # one bad minute (the third) in the first hour
    outcomes = TickOutcomes(
        tick_s=15.0, requests=requests, good_both=good, good_ttft=good, good_itl=requests,
        provisioned=np.full(ticks, 4, dtype=np.int64), ready=np.full(ticks, 4, dtype=np.int64),
        scaled=np.zeros(ticks, dtype=bool),
    )  # fmt: skip
    whole = score(outcomes, 0.0, 7200.0)
    assert whole.violation_minutes == 1
    assert whole.worst_hour_attainment == pytest.approx(1 - 200 / 24_000)
    assert whole.replica_hours == pytest.approx(8.0)
    later = score(outcomes, 1800.0, 7200.0)
    assert later.violation_minutes == 0 and later.attainment_both == 1.0
    assert later.replica_hours == pytest.approx(6.0)
