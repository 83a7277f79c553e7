"""Prefix caching through the engine core on the deterministic fake executor.

The fake executor keeps token ids as its "KV" and derives each token from
what it reads back, so a shared block that was never computed, or one
overwritten by another sequence, changes the output and fails these tests.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import wire
from engine.batch import StepPlan
from engine.core import EngineCore
from engine.core_proc import CoreOptions
from engine.engine_types import EngineConfig
from engine.executors import ExecutorOptions
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.stats import StepStats
from tests.engine.fake_executor import FakeExecutor, reference_tokens


class NoSharedWrites(FakeExecutor):
    """Fails a step that writes KV into a block more than one sequence holds."""

    core: EngineCore | None = None

    def execute(self, plan: StepPlan) -> object:  # type: ignore[override]
        assert self.core is not None
        size = self.block_size
        for chunk in plan.chunks:
            for pos in range(chunk.num_computed, chunk.num_computed + len(chunk.token_ids)):
                block = chunk.block_table[pos // size]
                assert self.core.blocks.ref_count(block) == 1, f"a step writes into shared block {block}"
        return super().execute(plan)


def run(requests: list[tuple[int, list[int], int]], *, caching: bool, num_blocks: int = 64,
        budget: int = 16) -> tuple[dict[str, list[int]], list[StepStats], EngineCore]:
    """Serve ``(arrival step, prompt, max_tokens)`` requests to the end; tokens per request and every step's stats."""
    executor = NoSharedWrites(num_blocks=num_blocks)
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=budget), enable_prefix_caching=caching)
    core = EngineCore(executor, config)
    executor.core = core
    tokens: dict[str, list[int]] = {}
    stats: list[StepStats] = []
    step = 0
    pending = sorted(enumerate(requests), key=lambda item: item[1][0])
    while pending or core.has_work():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, max_tokens) = pending.pop(0)
            core.add_request(f"r{index}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
            tokens[f"r{index}"] = []
        result = core.step()
        for out in result.outputs:
            if out.token_id is not None:
                tokens[out.request_id].append(out.token_id)
        if result.stats is not None:
            stats.append(result.stats)
        core.blocks.check_invariants()
        step += 1
    return tokens, stats, core


SYSTEM = [(7 * i) % 50 + 3 for i in range(22)]


def test_hits_skip_the_shared_prefix_and_outputs_do_not_change() -> None:
    prompts = [[*SYSTEM, 10 + i, 20 + i, 30 + i] for i in range(4)]
    requests = [(0, prompts[0], 3), *((10 + i, p, 3) for i, p in enumerate(prompts[1:]))]
    on, on_stats, core = run(requests, caching=True)
    off, off_stats, _ = run(requests, caching=False)
    for index, prompt in enumerate(prompts):
        assert on[f"r{index}"] == off[f"r{index}"] == reference_tokens(prompt, 3)
    hits = sum(s.prefix_cache_hits for s in on_stats)
    assert sum(s.prefix_cache_queries for s in on_stats) == sum(map(len, prompts))
    assert hits == 3 * 20  # 5 full blocks of the 22-token prefix, for each later request
    assert sum(s.prefix_cache_queries + s.prefix_cache_hits for s in off_stats) == 0
    assert core.kv_state()[0] == 0 and core.blocks.num_cached > 0


def test_prompt_tokens_count_each_whole_prompt_once_cache_hits_included() -> None:
    """vLLM's ``vllm:prompt_tokens``: the prompt's length, cached tokens included, in the step of its first token
    (the capacity model discounts the cache hits itself, from the hit rate)."""
    prompts = [[*SYSTEM, 10 + i, 20 + i, 30 + i] for i in range(4)]
    requests = [(0, prompts[0], 3), *((10 + i, p, 3) for i, p in enumerate(prompts[1:]))]
    _, on_stats, _ = run(requests, caching=True)
    _, off_stats, _ = run(requests, caching=False)
    assert sum(s.prefix_cache_hits for s in on_stats) > 0
    assert sum(s.prompt_tokens for s in on_stats) == sum(s.prompt_tokens for s in off_stats) == sum(map(len, prompts))
    assert all(s.prompt_tokens == 25 * len(s.ttfts_s) for s in on_stats)  # with the first token, never before


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 2), st.integers(0, 30), st.integers(1, 6)),
                min_size=1, max_size=10))
def test_random_workloads_match_the_reference_under_preemption_and_eviction(
    specs: list[tuple[int, int, int, int]],
) -> None:
    """Prompts share family prefixes of random length; a tight cache forces preemptions and evictions."""
    requests = []
    for index, (arrival, family, shared, max_tokens) in enumerate(specs):
        prefix = [(family * 13 + i * 5) % 60 + 1 for i in range(shared)]
        requests.append((arrival, [*prefix, (index * 11) % 60 + 1, 2, 3], max_tokens))
    tokens, stats, core = run(requests, caching=True, num_blocks=14)
    for index, (_, prompt, max_tokens) in enumerate(requests):
        assert tokens[f"r{index}"] == reference_tokens(prompt, max_tokens)
    assert all(s.prefix_cache_hits <= s.prefix_cache_queries for s in stats)
    assert core.kv_state() == (0, 14)


def test_the_switch_and_the_counts_cross_the_process_boundary() -> None:
    options = CoreOptions(executor=ExecutorOptions(checkpoint=Path("ckpt")),
                          engine=EngineConfig(enable_prefix_caching=False),
                          input_address="ipc://in", output_address="ipc://out", parent_pid=1)
    assert CoreOptions.from_json(options.to_json()).engine.enable_prefix_caching is False
    assert EngineConfig().enable_prefix_caching is True  # vLLM V1's default
    stats = StepStats(now_s=1.0, step_duration_s=0.1, num_running=1, num_waiting=0, kv_cache_usage=0.5,
                      prompt_tokens=3, generation_tokens=1, prefix_cache_queries=35, prefix_cache_hits=32)
    back = wire.stats_from_wire(wire.unpack(wire.pack([wire.stats_to_wire(stats)]))[0])
    assert (back.prefix_cache_queries, back.prefix_cache_hits) == (35, 32)
