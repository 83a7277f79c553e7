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
    """Fails a step that writes KV into a block another sequence held before it: that one may read the KV.

    (A block keyed at its allocation to this step is written by it, and may already be shared by a prompt
    admitted beside it: the model writes every chunk's KV before any attention reads it.)
    """

    core: EngineCore | None = None
    tables_before: dict[int, set[int]] | None = None
    """Each sequence's blocks when the last step ended."""

    def execute(self, plan: StepPlan) -> object:  # type: ignore[override]
        assert self.core is not None
        blocks, size = self.core.blocks, self.block_size
        before = self.tables_before or {}
        written: set[int] = set()
        for chunk in plan.chunks:
            slots = {chunk.block_table[pos // size] * size + pos % size
                     for pos in range(chunk.num_computed, chunk.num_computed + len(chunk.token_ids))}
            assert not slots & written, "two chunks of a step write one KV slot"
            written |= slots
            for block in {slot // size for slot in slots}:
                readers = [seq for seq in blocks.holders() if seq != chunk.seq_id and block in before.get(seq, ())
                           and block in blocks.block_table(seq)]
                assert not readers, f"a step writes into block {block}, which {readers} held before it"
        out = super().execute(plan)
        self.tables_before = {seq: set(blocks.block_table(seq)) for seq in blocks.holders()}
        return out


def run(requests: list[tuple[int, list[int], int]], *, caching: bool = True, num_blocks: int = 64,
        budget: int = 16, block_size: int = 4, fail_on_step: int | None = None
        ) -> tuple[dict[str, list[int]], list[StepStats], EngineCore]:  # fmt: skip
    """Serve ``(arrival step, prompt, max_tokens)`` requests to the end; tokens per request and every step's stats."""
    executor = NoSharedWrites(num_blocks=num_blocks, block_size=block_size, max_len=512, fail_on_step=fail_on_step)
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


def _serve_together(prompts: list[list[int]], *, budget: int, fail_on_step: int | None = None
                    ) -> tuple[dict[str, list[int]], list[StepStats], EngineCore, NoSharedWrites]:  # fmt: skip
    """Every prompt added before the first step (admitted in one step while the budget lasts), in blocks of 16."""
    tokens, stats, core = run([(0, prompt, 3) for prompt in prompts], budget=budget, block_size=16,
                              fail_on_step=fail_on_step)
    assert isinstance(core.executor, NoSharedWrites)
    return tokens, stats, core, core.executor


def test_identical_prompts_admitted_in_one_step_share_their_full_blocks() -> None:
    """An ``n=2`` completion (or a burst of one prompt) computed the prompt once per choice and counted no hit:
    blocks were keyed only after a step had computed them.  They are keyed at allocation (vLLM's
    ``allocate_slots``): the model writes the whole step's KV before any attention reads it."""
    prompt = [t % 64 for t in range(3, 67)]  # 4 full blocks of 16
    tokens, stats, _, executor = _serve_together([prompt, prompt], budget=512)
    assert tokens == {"r0": reference_tokens(prompt, 3), "r1": reference_tokens(prompt, 3)}
    assert (stats[0].prefix_cache_queries, stats[0].prefix_cache_hits) == (128, 48)  # vLLM's counts
    assert sum(len(chunk.token_ids) for chunk in executor.plans[0].chunks) == 64 + 16


def test_prompts_admitted_beside_the_last_chunk_of_a_prefill_share_the_block_it_completes() -> None:
    """The first prompt is computed over two steps (40 then 16 tokens); the others, admitted beside its last
    chunk, share the block that chunk completes (keyed at allocation, written before any attention reads it).

    A prompt is only ever admitted beside running sequences' last chunks (a chunk cut short takes the rest of
    the budget), so within a step no partial block can be shared; where one could be, after a preemption
    mid-prefill, is the next test's."""
    prompt = [t % 64 for t in range(5, 61)]  # 56 tokens: 3 full blocks of 16, then 8
    tokens, stats, _, executor = _serve_together([prompt, prompt, prompt], budget=40)
    assert all(out == reference_tokens(prompt, 3) for out in tokens.values())
    assert [len(chunk.token_ids) for chunk in executor.plans[1].chunks] == [16, 8, 8]
    assert sum(s.prefix_cache_hits for s in stats) == 2 * 48


def test_a_prompt_preempted_mid_prefill_is_recomputed_from_the_blocks_its_chunks_wrote_only() -> None:
    """A block is keyed only once the step allocated to it fills it, never for the tokens a later chunk was to
    write: a sequence preempted before that chunk would leave the key on half-written KV, and its recompute
    (or any prompt with that prefix) would reuse the block and generate from slots never written.

    In blocks of 4 with 7 blocks, the long prompt's first chunk (5 tokens, beside the short prompt's 11) fills
    block 0 and 1 slot of block 1; its next chunk finds no free block, so it is preempted.  Readmitted once the
    short request is done, it reuses block 0 alone and computes from token 4."""
    short, long_prompt = [t % 64 for t in range(40, 51)], [t % 64 for t in range(3, 25)]  # 11 and 22 tokens
    tokens, stats, core = run([(0, short, 2), (0, long_prompt, 3)], num_blocks=7, budget=16)
    assert tokens == {"r0": reference_tokens(short, 2), "r1": reference_tokens(long_prompt, 3)}
    assert isinstance(core.executor, NoSharedWrites)
    first_chunk, readmitted = core.executor.plans[0].chunks[1], core.executor.plans[2].chunks[0]
    assert (first_chunk.num_computed, len(first_chunk.token_ids), stats[1].num_preemptions) == (0, 5, 1)
    assert (readmitted.seq_id, readmitted.num_computed) == (first_chunk.seq_id, 4)


def test_a_failed_step_leaves_no_key_on_the_blocks_it_was_to_fill() -> None:
    """Blocks keyed at allocation whose step failed hold no KV: the next request with that prompt computes it."""
    prompt = [t % 64 for t in range(3, 67)]
    _, _, core, executor = _serve_together([prompt, prompt], budget=512, fail_on_step=1)
    assert core.blocks.num_cached == 0
    core.add_request("again", prompt, SamplingParams(max_tokens=3, temperature=0.0))
    outputs = [out for _ in range(4) for out in core.step().outputs]
    assert [out.token_id for out in outputs] == reference_tokens(prompt, 3)
    assert sum(len(chunk.token_ids) for chunk in executor.plans[-3].chunks) == 64
