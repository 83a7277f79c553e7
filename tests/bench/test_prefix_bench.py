"""``moeslo bench prefix`` at toy sizes: the figures are there and the hit path is the one measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.prefix import PrefixBenchConfig, run


def test_prefix_bench_measures_real_hits_and_no_reuse_has_none(tiny_checkpoint: Path) -> None:
    cfg = PrefixBenchConfig(prompt_tokens=96, shared_tokens=64, rounds=2, requests=3, request_prompt_tokens=20,
                            new_tokens=3, max_num_batched_tokens=32, threads=1)
    result = run(tiny_checkpoint, cfg)
    ttft, cost = result["ttft"], result["no_reuse_overhead"]
    assert ttft["hit_tokens"] == [64, 64]
    assert ttft["first_tokens_identical"] == "2/2"
    assert ttft["ratio_hit_over_cold"]["min"] > 0
    assert cost["prefix_cache_hits_on"] == 0 and cost["prefix_cache_queries_on"] == 2 * 3 * 20
    assert set(cost["overhead_fraction"]) == {"median", "min", "max"}
    # The scheduler's own time is measured in both runs, and caching's share of it is a share of the run.
    assert cost["scheduler_ms_on"]["min"] > 0 and cost["scheduler_ms_off"]["min"] > 0
    assert -1 < cost["bookkeeping_fraction"]["median"] < 1


def test_reported_threads_are_a_large_steps_not_the_last_steps(tiny_checkpoint: Path) -> None:
    # The toy prompts' decode steps run on one thread (under PARALLEL_MIN_TOKENS); the report names the
    # threads the bench set for its prefills, which read 1 on a 2-CPU machine before.
    cfg = PrefixBenchConfig(prompt_tokens=96, shared_tokens=64, rounds=1, requests=2, request_prompt_tokens=20,
                            new_tokens=3, max_num_batched_tokens=32, threads=2)
    result = run(tiny_checkpoint, cfg)
    assert result["threads"] == 2
    assert result["parallel_min_tokens"] > 1


def test_shared_prefix_must_be_shorter_than_the_prompt() -> None:
    with pytest.raises(ValueError, match="shared_tokens"):
        PrefixBenchConfig(prompt_tokens=100, shared_tokens=100)
