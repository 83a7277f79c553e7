"""Requests no fleet can serve within the TTFT objective: their share, and signals that ignore them."""

from __future__ import annotations

import math

import pytest

from contracts.ttft_objective import TtftAllowance
from controller.capacity import DEFAULT_PROFILE, CapacityModel, Targets
from controller.feasibility import feasible_view, infeasible_share
from controller.types import PolicyObservation, SliSnapshot

BUCKETS = ((1000.0, 10.0), (10000.0, 60.0), (20000.0, 90.0), (math.inf, 100.0))


def test_longest_feasible_prompt_from_the_objective_and_the_profile() -> None:
    flat = TtftAllowance()
    # 10 ms overhead, 24k tokens/s: 0.49 s of prefill is 11,760 tokens.
    assert flat.longest_feasible_prompt(0.5, overhead_s=0.01, prefill_tokens_per_s=24_000) == pytest.approx(11_760)
    assert not flat.is_infeasible(11_000, 0.5, overhead_s=0.01, prefill_tokens_per_s=24_000)
    assert flat.is_infeasible(12_000, 0.5, overhead_s=0.01, prefill_tokens_per_s=24_000)
    assert not flat.is_infeasible(12_000, 0.5, overhead_s=0.01, prefill_tokens_per_s=24_000, uncached_tokens=4000)
    # An allowance above the prefill time per token makes every length feasible.
    generous = TtftAllowance(1000, 0.05)
    assert math.isinf(generous.longest_feasible_prompt(0.5, overhead_s=0.01, prefill_tokens_per_s=24_000))
    # 20 ms per 1k against 41.7 ms of prefill per 1k: 0.49 - 1000 / 24000 = 0.448 s left at 21.7 ms per 1k.
    slow = TtftAllowance(1000, 0.02)
    limit = slow.longest_feasible_prompt(0.5, overhead_s=0.01, prefill_tokens_per_s=24_000)
    assert limit == pytest.approx(1000 + (0.49 - 1000 / 24000) / (1 / 24000 - 0.02 / 1000))
    assert slow.is_infeasible(limit + 10, 0.5, overhead_s=0.01, prefill_tokens_per_s=24_000)
    assert not slow.is_infeasible(limit - 10, 0.5, overhead_s=0.01, prefill_tokens_per_s=24_000)


def test_the_capacity_model_counts_cached_tokens_as_free() -> None:
    model = CapacityModel(DEFAULT_PROFILE, Targets())
    flat_limit = model.longest_feasible_prompt()
    model.prefix_hit_rate = 0.5
    assert model.longest_feasible_prompt() == pytest.approx(2 * flat_limit)


def test_infeasible_share_from_the_prompt_length_histogram() -> None:
    assert infeasible_share(BUCKETS, 15000.0) == pytest.approx(1 - 75 / 100)  # halfway into (10k, 20k]
    assert infeasible_share(BUCKETS, 500.0) == pytest.approx(0.95)
    assert infeasible_share(BUCKETS, 50000.0) == pytest.approx(0.10)  # beyond the last edge: all of +Inf
    assert infeasible_share(BUCKETS, math.inf) == 0.0
    assert infeasible_share((), 1000.0) is None


def test_scale_up_signals_judge_ttft_over_the_feasible_requests() -> None:
    sli = SliSnapshot(observed_at_s=0.0, ttft_good_ratio=0.72, ttft_p99_s=3.0,
                      ttft_good_ratio_by_window={"5m": 0.72, "1h": 0.8}, itl_good_ratio=0.99)  # fmt: skip
    obs = PolicyObservation(policy="p", observed_at_s=0.0, sli=sli)
    view = feasible_view(obs, 0.2)
    assert view.sli is not None
    assert view.sli.ttft_good_ratio == pytest.approx(0.9)
    assert view.sli.ttft_good_ratio_by_window == {"5m": pytest.approx(0.9), "1h": 1.0}
    assert view.sli.ttft_p99_s is None  # the infeasible tail owns the p99
    assert view.sli.itl_good_ratio == 0.99
    assert feasible_view(obs, 0.0) is obs and feasible_view(obs, None) is obs
