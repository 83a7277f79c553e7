"""Dynamo's load-based planner on aggregated workers, and the per-engine KV demand it reads."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import ValidationError
from contracts.traces import RequestTrace
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fleet import RequestFleet
from controller.replay.runner import build_strategy, run_setting
from controller.replay.settings import SWEEP_GRIDS, Setting, parse_setting
from controller.replay.signals import FleetView, MetricsPipeline, TickSample
from controller.replay.strategies import DynamoLoadStrategy
from controller.replay.world import ProfileCache, World
from tests.controller.replay.test_replay import context


def _pipeline(demands: list[float]) -> MetricsPipeline:
    pipeline = MetricsPipeline(tick_s=15.0, ticks=len(demands))
    for k, demand in enumerate(demands):
        pipeline.record(k, TickSample(
            ready=1, waiting=0.0, running=0.0, kv_usage_sum=0.0, kv_demand_max=demand, finished=0.0,
            prompt_tokens=0.0, output_tokens=0.0, ttft_sum_s=0.0, itl_sum_s=0.0, duration_sum_s=0.0,
        ))  # fmt: skip
    return pipeline


def _view(pipeline: MetricsPipeline, tick: int, spec: int, ready: int) -> FleetView:
    return FleetView(pipeline=pipeline, tick=tick, now_s=15.0 * (tick + 1), spec_replicas=spec, ready_replicas=ready)


def test_one_worker_up_past_the_threshold_and_none_while_one_is_starting() -> None:
    planner = DynamoLoadStrategy(scale_up=1.0, scale_down=0.6, max_replicas=5, tick_s=15.0)
    pipeline = _pipeline([1.2, 1.2, 1.2])
    assert planner.desired(_view(pipeline, 0, spec=3, ready=3)) == 4
    assert planner.desired(_view(pipeline, 1, spec=4, ready=3)) == 4  # scaling in progress: observe only
    assert planner.desired(_view(pipeline, 2, spec=5, ready=5)) == 5  # at the budget


def test_down_one_worker_per_five_second_interval_in_a_tick_never_below_one() -> None:
    planner = DynamoLoadStrategy(scale_up=1.0, scale_down=0.6, max_replicas=10, tick_s=15.0)
    pipeline = _pipeline([0.5, 0.5, 0.8])
    assert planner.desired(_view(pipeline, 0, spec=8, ready=8)) == 5
    assert planner.desired(_view(pipeline, 1, spec=2, ready=2)) == 1
    assert planner.desired(_view(pipeline, 2, spec=8, ready=8)) == 8  # between the thresholds: hold


def test_thresholds_out_of_order_are_refused() -> None:
    with pytest.raises(ValidationError, match="scale_down < scale_up"):
        DynamoLoadStrategy(scale_up=0.4, scale_down=0.6, max_replicas=4, tick_s=15.0)
    with pytest.raises(ValidationError, match="no knob"):
        parse_setting("dynamo-load:threshold=0.5")


def test_kv_demand_counts_running_kv_by_progress_and_queued_prompts_per_replica() -> None:
    # One replica: the first request decodes alone, the second queues behind its prefill (same arrival).
    trace = RequestTrace("two", np.array([0.0, 0.0]), np.array([4000, 3000], dtype=np.int64),
                         np.array([1000, 10], dtype=np.int64))  # fmt: skip
    fleet = RequestFleet(trace, ProfileCache(DEFAULT_PROFILE, World(), Targets()), initial_replicas=1, tick_s=15.0)
    fleet.advance(0.001)
    capacity = DEFAULT_PROFILE.kv_capacity_tokens
    queued_at = float(fleet.start_s[1]) / 2  # the first prefills, the second waits
    assert fleet.sample(queued_at).kv_demand_max == pytest.approx(7000 / capacity)
    # 500 steps after its first token the long one holds 500 generated tokens; the short one is done.
    later = float(fleet.ttft_s[0]) + 500 * float(fleet.itl_s[0])
    assert float(fleet.ttft_s[1]) + 10 * float(fleet.itl_s[1]) < later
    assert fleet.sample(later).kv_demand_max == pytest.approx((4000 + 500) / capacity, rel=1e-3)


def test_the_grid_holds_valid_pairs_and_the_replay_runs_it() -> None:
    for knobs in SWEEP_GRIDS["dynamo-load"]:
        assert 0 < float(knobs["scale_down"]) < float(knobs["scale_up"])
    ctx = context()
    assert isinstance(build_strategy(Setting.of("dynamo-load"), ctx), DynamoLoadStrategy)
    step_tick = 600 // 15
    provisioned = run_setting(parse_setting("dynamo-load:scale_up=0.4,scale_down=0.1"), ctx).outcomes.provisioned
    assert provisioned[-1] > provisioned[step_tick - 1]  # the 4x step pushed KV demand up
