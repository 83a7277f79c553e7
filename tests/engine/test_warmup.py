"""The engine core's warm-up: requests through the model that leave nothing behind."""

from __future__ import annotations

import pytest

from contracts.errors import ValidationError
from contracts.placement import Placement
from engine.core import WARMUP_LONGEST_PROMPT, EngineCore
from engine.engine_types import EngineConfig
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.stats import PlacementSwapStats
from tests.engine.fake_executor import FakeExecutor, reference_tokens


def _core(budget: int = 16) -> tuple[EngineCore, FakeExecutor]:
    executor = FakeExecutor(num_blocks=128)
    return EngineCore(executor, EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=budget))), executor


def test_warm_up_runs_full_prefill_chunks_and_growing_decode_batches() -> None:
    core, executor = _core(budget=16)
    steps = core.warm_up(4, output_tokens=3)
    assert steps == executor.steps > 0
    decode_batches = {sum(1 for c in plan.chunks if len(c.token_ids) == 1) for plan in executor.plans}
    assert {1, 2, 3} <= decode_batches
    prompt_sizes = [sum(len(c.token_ids) for c in plan.chunks) for plan in executor.plans]
    assert max(prompt_sizes) == 16  # a full chunk went through


def test_nothing_of_the_warm_up_is_left_to_see() -> None:
    core, executor = _core()
    core.warm_up(8)
    assert not core.has_work() and not core.has_news()
    assert core.blocks.num_used == 0
    idle = core.step()
    assert idle.outputs == [] and idle.stats is None
    # The longest warm-up prompt again (the eighth: 16 tokens, four full blocks): no prefix-cache hit,
    # its blocks were dropped; the right tokens out.
    prompt = [(7 * 7 + j) % executor.config.vocab_size for j in range(16)]
    core.add_request("user", prompt, SamplingParams(max_tokens=4, temperature=0.0))
    tokens, hits = [], 0
    while core.has_work():
        result = core.step()
        tokens += [o.token_id for o in result.outputs if o.token_id is not None]
        hits += result.stats.prefix_cache_hits if result.stats is not None else 0
    assert hits == 0
    assert tokens == reference_tokens(prompt, 4)


def test_a_large_budget_caps_the_warm_up_prompts_at_the_longest() -> None:
    core, executor = _core(budget=512)
    assert core.warm_up(8, output_tokens=2) > 0  # under the fake's 256 positions, so nothing refused
    # A sequence's first logits come at the end of its prompt: its length is where that chunk ends.
    prompt_lengths = {chunk.seq_id: chunk.num_computed + len(chunk.token_ids)
                      for plan in reversed(executor.plans) for chunk in plan.chunks if chunk.needs_logits}
    assert sorted(prompt_lengths.values()) == [16 * (i + 1) for i in range(8)]
    assert max(prompt_lengths.values()) == WARMUP_LONGEST_PROMPT


def test_a_negative_warm_up_is_refused() -> None:
    with pytest.raises(ValidationError, match="warmup_requests"):
        EngineConfig(warmup_requests=-1)


def test_the_warm_up_waits_for_room_in_a_small_queue() -> None:
    executor = FakeExecutor(num_blocks=128)
    core = EngineCore(executor, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=1, max_waiting=1)))
    assert core.warm_up(8, output_tokens=2) > 0
    assert not core.has_work()


class TwoRanks(FakeExecutor):
    """The fake with two EP ranks: it records the placements it is asked to apply."""

    def __init__(self) -> None:
        super().__init__(num_blocks=128)
        self._placement = Placement.contiguous(2, 4, 2)
        self.applied: list[Placement] = []

    @property
    def num_ranks(self) -> int:
        return 2

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        placement.validate(num_layers=2, num_experts=4, num_ranks=2)
        self.applied.append(placement)
        self._placement = placement
        return PlacementSwapStats(duration_s=0.001, experts_moved=4, bytes_moved=100)


def test_with_two_ranks_the_warm_up_swaps_every_expert_away_and_back() -> None:
    executor = TwoRanks()
    core = EngineCore(executor, EngineConfig())
    original = executor.placement
    core.warm_up(2)
    away, back = executor.applied
    for layer in range(2):
        assert set(away.experts_on_rank(layer, 0).tolist()) == set(original.experts_on_rank(layer, 1).tolist())
    assert back == original and core.placement == original
    assert not core.has_news() and core.step().stats is None  # no swap statistics left to publish


@pytest.mark.parametrize(("num_blocks", "block_size", "context"), [(2, 4, 8), (2, 1, 2), (3, 2, 6)])
def test_a_context_of_a_few_tokens_shortens_the_warm_up_instead_of_refusing_it(
    num_blocks: int, block_size: int, context: int
) -> None:
    # The smallest KV budget the executor takes (two blocks): the warm-up's own requests must fit it.
    executor = FakeExecutor(num_blocks=num_blocks, block_size=block_size)
    core = EngineCore(executor, EngineConfig())
    assert core.max_model_len == context
    assert core.warm_up(8) > 0
    assert not core.has_work() and core.blocks.num_used == 0
    longest = max(chunk.num_computed + len(chunk.token_ids) for plan in executor.plans for chunk in plan.chunks)
    assert longest <= context


def test_a_context_of_one_token_has_no_warm_up() -> None:
    core = EngineCore(FakeExecutor(max_len=1), EngineConfig())
    assert core.max_model_len == 1
    assert core.warm_up(8) == 0
