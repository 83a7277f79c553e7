"""Scheduler and engine loop on a deterministic fake executor: batching, chunking, preemption, limits."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from contracts.errors import OverloadedError, PlacementError, UnavailableError
from contracts.placement import Placement
from engine.errors import PromptTooLongError
from engine.kv_cache import BlockManager
from engine.llm_engine import EngineConfig, LLMEngine, RequestOutput
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig, SeqStatus, Sequence
from engine.stats import RequestTiming, StepStats
from tests.engine.fake_executor import FakeExecutor, reference_tokens

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def make_seq(seq_id: int, prompt_len: int, max_tokens: int = 4) -> Sequence:
    prompt = [(seq_id * 7 + i) % 50 + 1 for i in range(prompt_len)]
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", prompt_token_ids=prompt,
                    params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                    timing=RequestTiming(request_id=f"r{seq_id}", arrival_s=0.0, prompt_tokens=prompt_len))


def commit(sched: Scheduler, token: int = 1) -> None:
    """Play the engine's part after a step: advance computed counts, append a token where sampled."""
    out = sched.schedule()
    for chunk, plan_chunk in zip(out.scheduled, out.plan.chunks, strict=True):
        chunk.seq.num_computed += chunk.num_tokens
        if plan_chunk.needs_logits:
            chunk.seq.output_token_ids.append(token)


def test_long_prompt_is_prefilled_in_chunks_under_the_budget() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8), BlockManager(64, 4))
    seq = make_seq(0, 20)
    sched.add(seq)
    sizes, logits = [], []
    for _ in range(3):
        out = sched.schedule()
        (chunk,) = out.plan.chunks
        sizes.append(len(chunk.token_ids))
        logits.append(chunk.needs_logits)
        assert chunk.num_computed == seq.num_computed
        seq.num_computed += len(chunk.token_ids)
    assert sizes == [8, 8, 4]
    assert logits == [False, False, True]


def test_prefill_chunk_rides_along_with_decode() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10), BlockManager(64, 4))
    a = make_seq(0, 5)
    sched.add(a)
    commit(sched)  # a prefilled, has one output token
    b = make_seq(1, 30)
    sched.add(b)
    out = sched.schedule()
    assert [(c.seq_id, len(c.token_ids)) for c in out.plan.chunks] == [(0, 1), (1, 9)]
    assert out.plan.chunks[0].needs_logits and not out.plan.chunks[1].needs_logits
    assert out.prompt_tokens == 9


def test_a_last_prompt_chunk_of_one_token_counts_as_prompt() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8), BlockManager(64, 4))
    seq = make_seq(0, 9)
    sched.add(seq)
    counted = []
    for _ in range(3):
        out = sched.schedule()
        counted.append(out.prompt_tokens)
        (chunk,) = out.plan.chunks
        seq.num_computed += len(chunk.token_ids)
        if chunk.needs_logits:
            seq.output_token_ids.append(1)
    assert counted == [8, 1, 0]  # the 9-token prompt counted whole; the next step is a decode


def test_max_num_seqs_bounds_the_batch() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100), BlockManager(64, 4))
    for i in range(4):
        sched.add(make_seq(i, 3))
    out = sched.schedule()
    assert [c.seq_id for c in out.plan.chunks] == [0, 1]
    assert len(sched.waiting) == 2


def test_out_of_blocks_preempts_the_youngest_and_recomputes_it() -> None:
    # 6 blocks of 4 tokens; three sequences of 7 prompt tokens take 2 blocks each.
    blocks = BlockManager(6, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), blocks)
    seqs = [make_seq(i, 7, max_tokens=8) for i in range(3)]
    for s in seqs:
        sched.add(s)
    commit(sched)  # all prefilled: 7 computed + 1 sampled, 2 blocks each, cache full
    commit(sched)  # one decode step: 8 computed + 1 sampled, still 2 blocks
    assert blocks.num_free == 0
    out = sched.schedule()  # each needs a 3rd block for position 8: the youngest goes
    assert out.num_preemptions == 1
    assert seqs[2].status is SeqStatus.WAITING and seqs[2].num_computed == 0
    assert sched.waiting[0] is seqs[2]
    assert seqs[2].num_preemptions == 1
    blocks.check_invariants()
    # The preempted sequence is later recomputed from prompt + its generated token, as a prompt chunk.
    for chunk, plan_chunk in zip(out.scheduled, out.plan.chunks, strict=True):
        chunk.seq.num_computed += chunk.num_tokens
        if plan_chunk.needs_logits:
            chunk.seq.output_token_ids.append(1)
    sched.finish(seqs[0], "length")
    out = sched.schedule()
    recompute = [c for c in out.plan.chunks if c.seq_id == 2]
    assert recompute and recompute[0].num_computed == 0 and len(recompute[0].token_ids) == 9
    assert recompute[0].token_ids == (*seqs[2].prompt_token_ids, 1, 1)
    assert [c.is_prompt for c in out.scheduled if c.seq is seqs[2]] == [True]


def test_waiting_queue_is_bounded() -> None:
    sched = Scheduler(SchedulerConfig(max_waiting=2), BlockManager(64, 4))
    sched.add(make_seq(0, 3))
    sched.add(make_seq(1, 3))
    with pytest.raises(OverloadedError) as info:
        sched.add(make_seq(2, 3), retry_after_s=3.5)
    assert info.value.retry_after_s == 3.5
    sched.schedule()  # admits both: the queue has room again
    sched.add(make_seq(2, 3))


def test_prompt_longer_than_context_or_cache_is_refused_with_limits() -> None:
    sched = Scheduler(SchedulerConfig(max_model_len=32), BlockManager(64, 4))
    with pytest.raises(PromptTooLongError) as info:
        sched.add(make_seq(0, 30, max_tokens=4))
    assert info.value.max_model_len == 32 and "32" in str(info.value)
    small_cache = Scheduler(SchedulerConfig(max_model_len=1000), BlockManager(4, 4))
    assert small_cache.max_model_len == 16
    with pytest.raises(PromptTooLongError):
        small_cache.add(make_seq(0, 14, max_tokens=4))


# ---------------------------------------------------------------- the engine loop


class Collect:
    def __init__(self) -> None:
        self.outputs: dict[str, list[RequestOutput]] = {}
        self.done = threading.Condition()

    def __call__(self, out: RequestOutput) -> None:
        with self.done:
            self.outputs.setdefault(out.request_id, []).append(out)
            self.done.notify_all()

    def wait(self, ids: list[str], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.done:
            while not all(self.outputs.get(i) and self.outputs[i][-1].finished for i in ids):
                left = deadline - time.monotonic()
                assert left > 0, "requests did not finish in time"
                self.done.wait(left)


class Steps:
    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def record(self, step: StepStats) -> None:
        self.steps.append(step)


def run_engine(executor: FakeExecutor, prompts: list[list[int]], max_tokens: int = 6,
               **sched: int) -> tuple[Collect, Steps, LLMEngine, list[str]]:
    steps = Steps()
    engine = LLMEngine(executor, EngineConfig(scheduler=SchedulerConfig(**sched)), sinks=[steps])
    engine.start()
    collect = Collect()
    # Under the engine's (reentrant) lock, every request is in before the first step: a test thread the
    # engine's loop outran between two requests saw the early ones finish first (no preemption in the
    # tight test, in a fresh clone's run).
    with engine._lock:
        ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0), collect)
               for p in prompts]
    collect.wait(ids)
    return collect, steps, engine, ids


PROMPTS = [[(i * 5 + j) % 60 + 1 for j in range(5 + 3 * i)] for i in range(8)]


def test_engine_output_is_independent_of_batching_and_preemption() -> None:
    roomy, _, e1, ids1 = run_engine(FakeExecutor(num_blocks=128), PROMPTS, max_tokens=6)
    # 14 blocks of 4 tokens cannot hold 8 sequences of up to 32 tokens: preemptions must happen.
    tight_exec = FakeExecutor(num_blocks=14)
    tight, steps, e2, ids2 = run_engine(tight_exec, PROMPTS, max_tokens=6, max_num_batched_tokens=16)
    try:
        assert sum(s.num_preemptions for s in steps.steps) > 0
        for prompt, a, b in zip(PROMPTS, ids1, ids2, strict=True):
            want = reference_tokens(prompt, 6)
            assert [o.token_id for o in roomy.outputs[a]] == want
            assert [o.token_id for o in tight.outputs[b]] == want
            assert tight.outputs[b][-1].finish_reason == "length"
        assert e2.kv_state()[0] == 0
        e2.blocks.check_invariants()
    finally:
        e1.shutdown()
        e2.shutdown()


def test_prompt_tokens_count_each_prompt_once_through_preemptions() -> None:
    """A preempted request's recompute is not counted again (vLLM counts each prompt at its first scheduling)."""
    _, steps, engine, _ = run_engine(FakeExecutor(num_blocks=14), PROMPTS, max_tokens=6, max_num_batched_tokens=16)
    engine.shutdown()
    assert sum(s.num_preemptions for s in steps.steps) > 0
    assert sum(s.prompt_tokens for s in steps.steps) == sum(map(len, PROMPTS))


def test_a_prompt_longer_than_the_budget_counts_whole_with_its_first_token() -> None:
    """A 9-token prompt in chunks of 8 and 1 counts 9, in the step its first token comes out."""
    prompt = [(3 * i) % 50 + 1 for i in range(9)]
    _, steps, engine, _ = run_engine(FakeExecutor(), [prompt], max_tokens=3, max_num_batched_tokens=8)
    engine.shutdown()
    counted = [(s.prompt_tokens, len(s.ttfts_s)) for s in steps.steps if s.prompt_tokens or s.ttfts_s]
    assert counted == [(9, 1)]


def test_step_stats_account_for_every_token_and_request() -> None:
    _collect, steps, engine, ids = run_engine(FakeExecutor(), PROMPTS[:4], max_tokens=5)
    engine.shutdown()
    deadline = time.monotonic() + 2
    while sum(len(s.finished) for s in steps.steps) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(s.generation_tokens for s in steps.steps) == 4 * 5
    assert sum(s.prompt_tokens for s in steps.steps) == sum(len(p) for p in PROMPTS[:4])
    assert len([t for s in steps.steps for t in s.ttfts_s]) == 4
    assert len([t for s in steps.steps for t in s.itls_s]) == 4 * 4
    finished = [f for s in steps.steps for f in s.finished]
    assert sorted(f.request_id for f in finished) == sorted(ids)
    assert all(f.ttft_s is not None and f.e2e_s >= f.ttft_s > 0 for f in finished)
    assert any(s.routing is not None for s in steps.steps)


def test_stop_token_ends_the_request_with_stop() -> None:
    prompt = PROMPTS[0]
    stop_at = reference_tokens(prompt, 6)[2]
    executor = FakeExecutor()
    engine = LLMEngine(executor)
    engine.start()
    collect = Collect()
    rid = engine.add_request(prompt, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(stop_at,)),
                             collect)
    collect.wait([rid])
    engine.shutdown()
    outs = collect.outputs[rid]
    assert outs[-1].finish_reason == "stop" and outs[-1].is_stop_token
    assert len(outs) == reference_tokens(prompt, 6).index(stop_at) + 1


def test_abort_frees_blocks_and_finishes_with_abort() -> None:
    executor = FakeExecutor(step_delay_s=0.01)
    engine = LLMEngine(executor)
    engine.start()
    collect = Collect()
    rid = engine.add_request(PROMPTS[3], SamplingParams(max_tokens=200, temperature=0.0), collect)
    assert executor.started.wait(5)
    assert engine.kv_state()[0] > 0
    assert engine.abort(rid)
    collect.wait([rid])
    assert collect.outputs[rid][-1].finish_reason == "abort"
    assert engine.kv_state()[0] == 0
    assert not engine.abort(rid)
    engine.shutdown()


def test_executor_failure_finishes_requests_with_error_and_engine_keeps_serving() -> None:
    executor = FakeExecutor(fail_on_step=2)
    engine = LLMEngine(executor)
    engine.start()
    collect = Collect()
    # The loop steps under the engine's (reentrant) lock: holding it, both requests are in before the first
    # step, so the failing second step holds both (a slow test thread had added the second after it).
    with engine._lock:
        ids = [engine.add_request(p, SamplingParams(max_tokens=4, temperature=0.0), collect) for p in PROMPTS[:2]]
    collect.wait(ids)
    assert {collect.outputs[i][-1].finish_reason for i in ids} == {"error"}
    again = engine.add_request(PROMPTS[0], GREEDY, collect)
    collect.wait([again])
    assert collect.outputs[again][-1].finish_reason == "length"
    assert engine.kv_state()[0] == 0
    engine.shutdown()


def test_shutdown_aborts_everything_in_flight() -> None:
    executor = FakeExecutor(step_delay_s=0.02)
    engine = LLMEngine(executor)
    engine.start()
    collect = Collect()
    ids = [engine.add_request(p, SamplingParams(max_tokens=200, temperature=0.0), collect) for p in PROMPTS[:3]]
    assert executor.started.wait(5)
    engine.shutdown()
    assert {collect.outputs[i][-1].finish_reason for i in ids} == {"abort"}
    assert executor.shut_down
    with pytest.raises(UnavailableError):
        engine.add_request(PROMPTS[0], GREEDY, collect)


def test_placement_requests_apply_between_steps_and_errors_propagate() -> None:
    executor = FakeExecutor()
    steps = Steps()
    engine = LLMEngine(executor, sinks=[steps])
    engine.start()
    try:
        new = Placement(np.array([[1, 0, 3, 2], [0, 1, 2, 3]], dtype=np.int64), 1)
        swap = engine.request_placement(new)
        assert swap.experts_moved == 2
        assert engine.placement == new
        with pytest.raises(PlacementError):
            engine.request_placement(Placement(np.array([[0, 0, 0, 0], [0, 1, 2, 3]], dtype=np.int64), 1))
        assert engine.placement == new
        deadline = time.monotonic() + 2
        while not any(s.placement_swap for s in steps.steps) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s.placement_swap for s in steps.steps if s.placement_swap] == [swap]
    finally:
        engine.shutdown()


def test_full_queue_raises_overloaded_with_retry_after() -> None:
    executor = FakeExecutor(step_delay_s=0.05)
    engine = LLMEngine(executor, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=1, max_waiting=2)))
    engine.start()
    collect = Collect()
    try:
        engine.add_request(PROMPTS[0], SamplingParams(max_tokens=50, temperature=0.0), collect)
        assert executor.started.wait(5)
        engine.add_request(PROMPTS[1], GREEDY, collect)
        engine.add_request(PROMPTS[2], GREEDY, collect)
        with pytest.raises(OverloadedError) as info:
            engine.add_request(PROMPTS[3], GREEDY, collect)
        assert info.value.retry_after_s >= 1.0
    finally:
        engine.shutdown()


def _prefix_seq(seq_id: int, prompt: list[int]) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", prompt_token_ids=prompt, params=GREEDY,
                    timing=RequestTiming(request_id=f"r{seq_id}", arrival_s=0.0, prompt_tokens=len(prompt)))


def test_shared_prefix_is_taken_from_the_cache_and_only_the_rest_computed() -> None:
    blocks = BlockManager(16, 4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), blocks)
    first = _prefix_seq(0, list(range(1, 11)))  # 2 full blocks + 2 tokens
    sched.add(first)
    commit(sched)
    sched.finish(first, "length")  # its full blocks stay cached, free
    assert blocks.num_used == 0 and blocks.num_cached == 2
    second = _prefix_seq(1, [*range(1, 9), 40, 41, 42])
    sched.add(second)
    out = sched.schedule()
    (chunk,) = out.plan.chunks
    assert chunk.num_computed == 8 and chunk.token_ids == (40, 41, 42)
    assert chunk.block_table[:2] == tuple(blocks.cached_prefix(first.block_hashes, 2))
    assert (out.prefix_cache_queries, out.prefix_cache_hits, out.prompt_tokens) == (11, 8, 3)
    blocks.check_invariants()


def test_the_last_prompt_token_is_always_computed() -> None:
    blocks = BlockManager(16, 4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), blocks)
    prompt = list(range(1, 9))  # exactly 2 blocks
    sched.add(_prefix_seq(0, prompt))
    commit(sched)
    sched.add(_prefix_seq(1, list(prompt)))  # the first still runs: its blocks are shared
    out = sched.schedule()
    chunk = out.plan.chunks[-1]
    assert chunk.block_table[0] == out.plan.chunks[0].block_table[0]
    # Both blocks are cached, but the second holds the last token: it is recomputed into a new block.
    assert chunk.num_computed == 4 and len(chunk.token_ids) == 4 and chunk.needs_logits
    assert out.prefix_cache_hits == 4
    blocks.check_invariants()


def test_no_lookup_and_no_counts_with_prefix_caching_off() -> None:
    blocks = BlockManager(16, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), blocks)
    sched.add(_prefix_seq(0, list(range(1, 11))))
    commit(sched)
    sched.add(_prefix_seq(1, list(range(1, 11))))
    out = sched.schedule()
    assert out.plan.chunks[-1].num_computed == 0
    assert (out.prefix_cache_queries, out.prefix_cache_hits) == (0, 0)


def test_retry_after_follows_the_recent_finish_rate_not_the_idle_time_before_a_burst() -> None:
    from engine.scheduler import drain_time_s

    # Minutes idle, then a burst: the finishes before the pause say nothing of the rate now.
    assert drain_time_s([0.0, 1.0, 2.0], waiting=29, now=300.0) == 1.0
    # Ten finishes a second over the last 3 s: 29 waiting drain in about 3 s (it said 60).
    burst = [300.0 + 0.1 * i for i in range(31)]
    assert drain_time_s([0.0, 1.0, *burst], waiting=29, now=303.5) == pytest.approx(2.9)
    assert drain_time_s(burst, waiting=10_000, now=303.5) == 60.0
