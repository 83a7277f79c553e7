"""The replay harness: deterministic for a seed, drives the production core, policies behave."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.traces import LengthDistribution, RequestTrace
from controller.builder import build_decision_core
from controller.capacity import DEFAULT_PROFILE, CapacityModel
from controller.core import DecisionCore
from controller.replay.baselines import CoreStrategy, HpaStrategy, OracleStrategy
from controller.replay.fluid import FluidFleet
from controller.replay.runner import ReplayConfig, needs_per_tick, run_policy, run_replay, summarise
from controller.replay.workload import make_workload
from controller.types import PolicyObservation


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


def test_replay_is_deterministic_for_a_seed() -> None:
    workload = make_workload(step_trace(), tick_s=15.0, mode="request")
    config = ReplayConfig(refit_every_ticks=20)
    first = run_replay(workload, ["hpa", "moeslo"], DEFAULT_PROFILE, config)
    second = run_replay(workload, ["hpa", "moeslo"], DEFAULT_PROFILE, config)
    for a, b in zip(first, second, strict=True):
        assert a.totals == b.totals
        np.testing.assert_array_equal(a.provisioned, b.provisioned)


def test_policies_on_a_step() -> None:
    workload = make_workload(step_trace(), tick_s=15.0, mode="request")
    config = ReplayConfig(refit_every_ticks=20)
    runs = {r.name: r for r in run_replay(workload, ["static", "oracle", "moeslo"], DEFAULT_PROFILE, config)}
    oracle, static, ours = runs["oracle"], runs["static"], runs["moeslo"]
    assert oracle.attainment >= 0.99
    assert static.attainment >= 0.99
    assert oracle.replica_hours < static.replica_hours
    # No forecast sees a 4x step coming: ours orders replicas within two ticks of it (the reactive
    # floor), and the start-up delay decides the rest.
    step_tick = 600 // 15
    assert ours.provisioned[step_tick + 2] > ours.provisioned[step_tick - 1]
    assert ours.provisioned[-1] >= 2 * ours.provisioned[step_tick - 1]
    assert ours.attainment >= 0.7
    summary = summarise(workload, list(runs.values()), DEFAULT_PROFILE)
    assert summary["policies"]["oracle"]["replica_hours_vs_oracle"] == 1.0  # type: ignore[index]


def test_moeslo_policy_is_the_production_core() -> None:
    workload = make_workload(step_trace(), tick_s=15.0, mode="request")
    needs = needs_per_tick(workload, CapacityModel())
    run = run_policy("moeslo", workload, DEFAULT_PROFILE, ReplayConfig(refit_every_ticks=20), needs=needs)
    assert run.reasons.get("forecast", 0) > 0  # decisions carried the predictive advisor's reasons
    policy = CoreStrategy(
        DEFAULT_PROFILE,
        tick_s=15.0,
        lead_time_s=120,
        cooldown_s=180,
        max_replicas=100,
        quantile=0.9,
        refit_every_ticks=240,
        season_s=None,
    )
    assert type(policy.core) is DecisionCore
    assert [type(a) for a in policy.core.advisors] == [type(a) for a in build_decision_core().advisors]


def test_oracle_orders_one_lead_time_ahead() -> None:
    needs = np.array([1, 1, 1, 1, 5, 5, 1, 1], dtype=np.float64)
    oracle = OracleStrategy(needs, lead_ticks=2)
    obs = PolicyObservation(policy="x", observed_at_s=0.0)
    plan = [oracle.desired(obs, 0.0, k) for k in range(len(needs))]
    # Decided after tick k, for ticks k+1..k+3: the 5s show up two ticks early and leave at once.
    assert plan == [1, 5, 5, 5, 5, 1, 1, 1]


def test_hpa_waits_out_its_stabilization_window() -> None:
    hpa = HpaStrategy(prefill_tokens_per_s_at_slo=1000.0, decode_tokens_per_s_at_slo=1000.0)

    def obs(prompt: float, replicas: int) -> PolicyObservation:
        return PolicyObservation(
            policy="x",
            observed_at_s=0.0,
            current_replicas=replicas,
            ready_replicas=replicas,
            prompt_tokens_per_s=prompt,
            output_tokens_per_s=0.0,
        )

    assert hpa.desired(obs(7000.0, 10), 0.0, 0) == 10  # exactly at 70 %: within tolerance
    assert hpa.desired(obs(14000.0, 10), 15.0, 1) == 20  # 140 %: double
    assert hpa.desired(obs(1400.0, 20), 30.0, 2) == 20  # load gone, but the window remembers 20
    assert hpa.desired(obs(1400.0, 20), 400.0, 3) == 2  # window passed


def test_fluid_fleet_attainment_tracks_capacity() -> None:
    rates = np.full(40, 20.0)
    prompt = rates * 1000.0
    output = rates * 150.0
    need = CapacityModel().replicas_needed(
        __import__("controller.capacity").capacity.Load(
            request_rate_rps=20.0, prompt_tokens_per_s=20000.0, output_tokens_per_s=3000.0
        )
    )
    results = {}
    for replicas in (1, need):
        fleet = FluidFleet(rates, prompt, output, DEFAULT_PROFILE, initial_replicas=replicas, startup_s=120, tick_s=15)
        for k in range(40):
            fleet.advance((k + 1) * 15.0)
            fleet.observe((k + 1) * 15.0)
        totals = fleet.totals(600.0)
        results[replicas] = totals.good_both / totals.requests
        assert totals.replica_seconds == pytest.approx(replicas * 600.0)
    assert results[need] >= 0.99
    assert results[1] < 0.5


def test_count_trace_workloads() -> None:
    from contracts.traces import CountTrace

    counts = CountTrace("c", 10.0, np.array([100.0, 200.0, 300.0, 400.0]))
    lengths = LengthDistribution.fixed(100, 10)
    fluid = make_workload(counts, tick_s=20.0, mode="fluid", lengths=lengths)
    np.testing.assert_allclose(fluid.rates_rps, [15.0, 35.0])
    np.testing.assert_allclose(fluid.prompt_tokens_per_s, [1500.0, 3500.0])
    request = make_workload(counts, tick_s=20.0, mode="request", lengths=lengths, seed=1)
    assert request.requests is not None and len(request.requests) == 1000
