"""Prefix reuse in the replay: LRU block caches, cached tokens, the best case, the trace's hash IDs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contracts.traces import RequestTrace, load_trace
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fleet import RequestFleet
from controller.replay.prefix_cache import BlockCache, best_case_uncached, pooled_hit_rate
from controller.replay.world import ProfileCache, World


def blocks(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int64)


def test_leading_full_blocks_hit_and_the_last_token_is_always_computed() -> None:
    cache = BlockCache(capacity_blocks=10)
    assert cache.cached_tokens(blocks(1, 2, 3), 1500) == 0
    cache.admit(blocks(1, 2, 3), 1500)  # two full blocks of 512; the third is partial and not cached
    assert len(cache) == 2
    assert cache.cached_tokens(blocks(1, 2, 3), 1500) == 1024
    assert cache.cached_tokens(blocks(1, 9, 3), 1500) == 512  # only the leading run counts
    assert cache.cached_tokens(blocks(5, 1), 1024) == 0  # an ID stands for its block and whole prefix
    assert cache.cached_tokens(blocks(1, 2), 1024) == 1023  # a fully cached prompt still computes one token


def test_least_recently_used_blocks_are_evicted_and_the_budget_never_grows() -> None:
    cache = BlockCache(capacity_blocks=3)
    cache.admit(blocks(1, 2), 1024)
    cache.admit(blocks(3), 512)
    cache.admit(blocks(1), 512)  # touches 1: 2 is now the least recently used
    cache.admit(blocks(4), 512)
    assert len(cache) == 3
    assert cache.cached_tokens(blocks(2), 1024) == 0
    assert cache.cached_tokens(blocks(1), 1024) == 512 and cache.cached_tokens(blocks(4), 1024) == 512


def test_a_prompts_tail_blocks_are_evicted_before_its_first() -> None:
    # A hit needs the leading blocks: evicting the first one first would leave the rest held and useless.
    cache = BlockCache(capacity_blocks=4)
    cache.admit(blocks(1, 2, 3), 1536)
    cache.admit(blocks(9), 512)
    cache.admit(blocks(10), 512)  # over the budget: the prompt's last block goes, its first two stay
    assert len(cache) == 4
    assert cache.cached_tokens(blocks(1, 2, 3), 1537) == 1024


def test_best_case_and_pooled_hit_rates() -> None:
    prompts = np.array([1024, 1536, 1024], dtype=np.int64)
    ids = (blocks(1, 2), blocks(1, 2, 3), blocks(7, 8))
    assert best_case_uncached(prompts, ids).tolist() == [1024, 512, 1024]
    assert best_case_uncached(prompts, None).tolist() == prompts.tolist()
    assert pooled_hit_rate(prompts, ids, 100) == 1024 / 3584
    assert pooled_hit_rate(prompts, ids, 0) == 0.0


def test_replicas_prefill_only_uncached_tokens() -> None:
    # Two requests with the same 8-block prefix, a minute apart, on one replica: the second prefills 1 token.
    same = (blocks(*range(8)), blocks(*range(8)))
    two = np.array([4096, 4096], dtype=np.int64)
    trace = RequestTrace("t", np.array([0.0, 60.0]), two, np.array([1, 1], dtype=np.int64), prefix_blocks=same)
    fleet = RequestFleet(trace, ProfileCache(DEFAULT_PROFILE, World(), Targets()), initial_replicas=1, tick_s=15.0)
    fleet.advance(120.0)
    assert fleet.cached_tokens.tolist() == [0, 4095]
    assert fleet.ttft_s[1] < fleet.ttft_s[0] / 10
    outcomes = fleet.outcomes(8)
    assert outcomes.cached_tokens is not None and outcomes.cached_tokens.sum() == 4095


def test_a_cached_token_costs_the_profiles_share_of_its_prefill() -> None:
    same = (blocks(*range(8)), blocks(*range(8)))
    two = np.array([4096, 4096], dtype=np.int64)
    trace = RequestTrace("t", np.array([0.0, 60.0]), two, np.array([1, 1], dtype=np.int64), prefix_blocks=same)
    ttft = {}
    for cost in (0.0, 0.5, 1.0):
        profile = DEFAULT_PROFILE.model_copy(update={"cached_token_cost": cost})
        fleet = RequestFleet(trace, ProfileCache(profile, World(), Targets()), initial_replicas=1, tick_s=15.0)
        fleet.advance(120.0)
        assert fleet.cached_tokens.tolist() == [0, 4095]  # hits are hits, whatever they cost
        ttft[cost] = fleet.ttft_s[1]
        assert ttft[cost] <= fleet.ttft_s[0] * (1 + 1e-9)
    assert ttft[0.0] < ttft[0.5] < ttft[1.0]
    # Half of 4095 cached tokens' prefill, at the rate beside one decoding sequence (its own first step).
    assert ttft[1.0] - ttft[0.5] == pytest.approx(0.5 * 4095 / DEFAULT_PROFILE.prefill_rate(1.0), rel=1e-6)


def test_mooncake_hash_ids_are_read_and_kept_through_windows(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 500, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
        '{"timestamp": 2500, "input_length": 600, "output_length": 5, "hash_ids": [9, 10]}\n'
    )
    trace = load_trace(path)
    assert isinstance(trace, RequestTrace) and trace.prefix_blocks is not None
    assert [b.tolist() for b in trace.prefix_blocks] == [[0, 1], [0, 1, 2], [9, 10]]
    assert [b.tolist() for b in trace.window(0.4, 3.0).prefix_blocks or ()] == [[0, 1, 2], [9, 10]]
    doubled = trace.rate_scale(2.0, seed=1)
    assert doubled.prefix_blocks is not None and len(doubled.prefix_blocks) == 2 * len(trace)
    assert trace.speedup(2.0).prefix_blocks is trace.prefix_blocks


def test_fluid_mode_judges_the_same_long_prompt_objective() -> None:
    from contracts.ttft_objective import TtftAllowance
    from controller.replay.fluid import FluidFleet

    # 12k-token prompts: the flat 500 ms is out of reach for every one of them; with 50 ms per 1k beyond
    # 1k tokens, a fleet with room meets it.
    rates = np.full(20, 1.0)
    prompts = np.full(200, 12_000, dtype=np.int64)
    attained = {}
    for per_1k in (0.0, 0.05):
        targets = Targets(ttft_allowance=TtftAllowance(1000, per_1k))
        fleet = FluidFleet(rates, rates * 12_000.0, rates * 50.0, ProfileCache(DEFAULT_PROFILE, World(), targets),
                           initial_replicas=8, tick_s=15, prompt_samples=prompts)  # fmt: skip
        for k in range(20):
            fleet.advance((k + 1) * 15.0)
        outcomes = fleet.outcomes(20)
        attained[per_1k] = float(outcomes.good_ttft.sum() / outcomes.requests.sum())
    assert attained[0.0] < 0.05 and attained[0.05] > 0.95
