"""Executors: equal outputs across placements and EP sizes, routing counts, live placement swaps."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from contracts.errors import PlacementError
from contracts.placement import Placement
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.executors import Executor, ExecutorOptions, create_executor
from engine.experts import plan_transfers
from tests.engine.helpers import run_sequences

# Sums over experts and ranks happen in another order than in one process: fp32 rounding only.
ATOL = 1e-5
CONFIG = ModelConfig(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=128, vocab_size=512,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def skewed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_random_checkpoint(tmp_path_factory.mktemp("skewed"), CONFIG, seed=5, router_skew=1.0)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (23, 9, 31)]


@pytest.fixture(scope="module")
def reference(skewed_checkpoint: Path, prompts: list[list[int]]) -> torch.Tensor:
    executor = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2))
    try:
        return run_sequences(executor, prompts, decode_steps=4)
    finally:
        executor.shutdown()


def _random_placement(layers: int, ranks: int, slots_per_rank: int, seed: int) -> Placement:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(layers):
        extra = ranks * slots_per_rank - CONFIG.num_experts
        row = np.concatenate([np.arange(CONFIG.num_experts), rng.integers(0, CONFIG.num_experts, extra)])
        rows.append(rng.permutation(row))
    return Placement(np.stack(rows).astype(np.int64), ranks)


@pytest.fixture(params=["rank-processes", "colocated-ranks"])
def ep2(skewed_checkpoint: Path, request: pytest.FixtureRequest) -> Iterator[Executor]:
    """Two EP ranks: as processes, or kept in this process (``colocate_ranks``): every test holds for both."""
    executor = create_executor(ExecutorOptions(
        checkpoint=skewed_checkpoint, kv_cache_mb=2, ep=2, slots_per_rank=5,
        colocate_ranks=request.param == "colocated-ranks",
    ))
    yield executor
    executor.shutdown()


@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_equal_across_placements_with_redundant_replicas(
    skewed_checkpoint: Path, prompts: list[list[int]], reference: torch.Tensor, seed: int
) -> None:
    placement = _random_placement(2, 1, 12, seed)
    executor = create_executor(
        ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2, slots_per_rank=12, placement=placement)
    )
    try:
        torch.testing.assert_close(run_sequences(executor, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)
    finally:
        executor.shutdown()


def test_chunked_prefill_equals_whole_prefill(
    skewed_checkpoint: Path, prompts: list[list[int]], reference: torch.Tensor
) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2))
    try:
        chunked = run_sequences(executor, prompts, decode_steps=4, chunk=5)
    finally:
        executor.shutdown()
    # Chunked prefill emits logits only at each prompt's end, as the whole prefill does.
    torch.testing.assert_close(chunked, reference, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_ep2_equals_ep1_and_survives_live_swaps(
    ep2: Executor, prompts: list[list[int]], reference: torch.Tensor
) -> None:
    assert ep2.num_ranks == 2
    torch.testing.assert_close(run_sequences(ep2, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)
    for seed in (3, 4):
        target = _random_placement(2, 2, 5, seed)
        old = ep2.placement
        stats = ep2.apply_placement(target)
        assert stats.experts_moved == _moves_by_sets(old, target) > 0
        assert ep2.placement == target
        torch.testing.assert_close(run_sequences(ep2, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)
    again = ep2.apply_placement(ep2.placement)
    assert again.experts_moved == 0


@pytest.mark.slow
def test_ep2_routing_counts(ep2: Executor, prompts: list[list[int]]) -> None:
    ep2.take_routing()
    run_sequences(ep2, prompts, decode_steps=3)
    delta = ep2.take_routing()
    assert delta is not None
    tokens = sum(len(p) for p in prompts) + 3 * len(prompts)
    assert delta.expert_tokens.sum(axis=1).tolist() == [tokens * CONFIG.num_experts_per_tok] * 2
    assert delta.rank_tokens.shape == (2, 2)
    assert delta.rank_tokens.sum(axis=1).tolist() == [tokens * CONFIG.num_experts_per_tok] * 2


@pytest.mark.slow
def test_colocated_ranks_count_per_rank_as_rank_processes_do(
    skewed_checkpoint: Path, prompts: list[list[int]]
) -> None:
    placement = _random_placement(2, 2, 5, 9)
    deltas = []
    for colocate in (False, True):
        executor = create_executor(ExecutorOptions(
            checkpoint=skewed_checkpoint, kv_cache_mb=2, ep=2, slots_per_rank=5, placement=placement,
            colocate_ranks=colocate,
        ))
        try:
            run_sequences(executor, prompts, decode_steps=3)
            deltas.append(executor.take_routing())
        finally:
            executor.shutdown()
    processes, colocated = deltas
    assert processes is not None and colocated is not None
    np.testing.assert_array_equal(colocated.rank_tokens, processes.rank_tokens)
    np.testing.assert_array_equal(colocated.expert_tokens, processes.expert_tokens)
    # The placement is skewed on purpose: the ranks' loads differ, so the equality is not 50/50 by chance.
    assert (colocated.rank_tokens[:, 0] != colocated.rank_tokens[:, 1]).any()


def test_routed_counts_sum_to_tokens_times_top_k(skewed_checkpoint: Path, prompts: list[list[int]]) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2))
    try:
        run_sequences(executor, prompts, decode_steps=2)
        delta = executor.take_routing()
        assert delta is not None
        tokens = sum(len(p) for p in prompts) + 2 * len(prompts)
        assert delta.expert_tokens.shape == (2, CONFIG.num_experts)
        assert delta.expert_tokens.sum(axis=1).tolist() == [tokens * 2, tokens * 2]
        # The skewed router really concentrates load on a few experts.
        assert delta.expert_tokens.max() > 2 * delta.expert_tokens.mean()
        again = executor.take_routing()
        assert again is not None and int(again.expert_tokens.sum()) == 0
        executor.set_routing_stats(False)
        run_sequences(executor, prompts[:1], decode_steps=1)
        assert executor.take_routing() is None
    finally:
        executor.shutdown()


def test_invalid_placements_are_refused_and_the_old_one_stays(
    skewed_checkpoint: Path, prompts: list[list[int]], reference: torch.Tensor
) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2, slots_per_rank=10))
    try:
        before = executor.placement
        missing = before.phy2log.copy()
        missing[1, :] = 0  # expert 0 everywhere: experts 1..7 have no replica
        bad = {
            "no replica": Placement(missing, 1),
            "shape": Placement(before.phy2log[:1], 1),
            "ranks": Placement(before.phy2log, 2),
            "slot count": Placement(np.tile(np.arange(8), (2, 1)), 1),
            "expert id": Placement(np.full((2, 10), 9), 1),
        }
        messages = {}
        for name, placement in bad.items():
            with pytest.raises(PlacementError) as info:
                executor.apply_placement(placement)
            messages[name] = str(info.value)
            assert executor.placement == before
        assert "experts 1, 2, 3, 4, 5, 6, 7 have no replica" in messages["no replica"]
        assert "1 layers" in messages["shape"]
        assert "2 ranks" in messages["ranks"]
        assert "8 slots per rank" in messages["slot count"]
        assert "[0, 8)" in messages["expert id"]
        torch.testing.assert_close(run_sequences(executor, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)
    finally:
        executor.shutdown()


def test_plan_transfers_moves_only_experts_a_rank_lacks() -> None:
    old = Placement(np.array([[0, 1, 2, 3]]), 2)
    new = Placement(np.array([[0, 2, 1, 3]]), 2)
    transfers = plan_transfers(old, new)
    assert [(t.expert, t.src, t.dst) for t in transfers] == [(2, 1, 0), (1, 0, 1)]
    assert plan_transfers(old, old) == []
    # A replica added on a rank that already holds the expert moves nothing.
    assert plan_transfers(Placement(np.array([[0, 1, 2, 2]]), 2), Placement(np.array([[0, 1, 2, 2]]), 2)) == []


def _moves_by_sets(old: Placement, new: Placement) -> int:
    """Experts a rank must receive: in its new slots but not its old ones (independent of plan_transfers)."""
    moves = 0
    for layer in range(new.num_layers):
        for rank in range(new.num_ranks):
            held = set(old.experts_on_rank(layer, rank).tolist())
            moves += len(set(new.experts_on_rank(layer, rank).tolist()) - held)
    return moves


@pytest.mark.slow
def test_ep2_swap_counts_moves_and_a_failed_swap_keeps_the_old_slots(
    ep2: Executor, prompts: list[list[int]], reference: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _random_placement(2, 2, 5, 7)
    expected = _moves_by_sets(ep2.placement, target)
    assert ep2.apply_placement(target).experts_moved == expected > 0
    before = ep2.placement
    from engine.experts import ExpertShard

    def fail(*_: object) -> None:
        raise MemoryError("no room for the new slots")

    # Rank 0 runs in this process: make its half of the swap fail after the weights moved.
    monkeypatch.setattr(ExpertShard, "prepare", fail)
    with pytest.raises(PlacementError, match="the old placement stays"):
        ep2.apply_placement(_random_placement(2, 2, 5, 8))
    monkeypatch.undo()
    assert ep2.placement == before and ep2.broken is None
    torch.testing.assert_close(run_sequences(ep2, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_ep2_refuses_a_malformed_step_before_the_ranks_take_part(
    ep2: Executor, prompts: list[list[int]], reference: torch.Tensor
) -> None:
    from contracts.errors import ValidationError
    from engine.batch import SeqChunk, StepPlan

    too_far = StepPlan((SeqChunk(0, CONFIG.max_position_embeddings, (1,), tuple(range(40)), True),))
    with pytest.raises(ValidationError, match="max_position_embeddings"):
        ep2.execute(too_far)
    with pytest.raises(ValidationError, match="token ids"):
        ep2.execute(StepPlan((SeqChunk(0, 0, (CONFIG.vocab_size,), (0,), True),)))
    assert ep2.broken is None
    torch.testing.assert_close(run_sequences(ep2, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)


def test_a_failed_local_swap_keeps_the_old_placement(
    skewed_checkpoint: Path, prompts: list[list[int]], reference: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.experts import ExpertShard

    executor = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2))
    try:
        before = executor.placement
        monkeypatch.setattr(ExpertShard, "prepare", lambda *_: (_ for _ in ()).throw(MemoryError("full")))
        with pytest.raises(PlacementError, match="the old placement stays"):
            executor.apply_placement(_random_placement(2, 1, 8, 1))
        monkeypatch.undo()
        assert executor.placement == before
        torch.testing.assert_close(run_sequences(executor, prompts, decode_steps=4), reference, atol=ATOL, rtol=0)
    finally:
        executor.shutdown()


def test_replicas_take_turns_even_for_one_decoding_sequence() -> None:
    from engine.experts import ReplicaTable

    placement = Placement(np.array([[0, 1, 2, 3, 3, 1]]), 2)
    table = ReplicaTable(placement, num_experts=4)
    picks = [table.physical(0, torch.tensor([[3, 1]])).tolist()[0] for _ in range(4)]
    assert {p[0] for p in picks} == {3, 4} and {p[1] for p in picks} == {1, 5}
    # Within one step, an expert's assignments alternate over its replicas.
    many = table.physical(0, torch.tensor([[3], [3], [3], [3]])).reshape(-1).tolist()
    assert sorted(many) == [3, 3, 4, 4]


@pytest.mark.slow
def test_ep2_steps_beyond_the_first_shared_buffers_equal_ep1(skewed_checkpoint: Path, ep2: Executor) -> None:
    # 3 x 300 prompt tokens in one step: more than the 512 rows the ranks' shared buffers start with.
    gen = torch.Generator().manual_seed(12)
    long_prompts = [torch.randint(0, 512, (300,), generator=gen).tolist() for _ in range(3)]
    one = create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2))
    try:
        expected = run_sequences(one, long_prompts, decode_steps=2)
    finally:
        one.shutdown()
    torch.testing.assert_close(run_sequences(ep2, long_prompts, decode_steps=2), expected, atol=ATOL, rtol=0)


def _kill_rank1_once_spawned(killed: list[int]) -> None:
    """SIGKILL EP rank 1's process as soon as it exists: long before it could load or join the group.  By name:
    ``active_children`` comes from a set, and its first was now and then rank 2."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ranks = [p for p in multiprocessing.active_children() if p.name == "moeslo-ep-rank1"]
        if ranks and ranks[0].pid is not None:
            os.kill(ranks[0].pid, signal.SIGKILL)
            killed.append(ranks[0].pid)
            return
        time.sleep(0.001)


@pytest.mark.slow
def test_a_rank_killed_at_startup_fails_the_start_in_seconds_naming_it(skewed_checkpoint: Path) -> None:
    from contracts.errors import UnavailableError

    killed: list[int] = []
    killer = threading.Thread(target=_kill_rank1_once_spawned, args=(killed,), daemon=True)
    killer.start()
    start = time.monotonic()
    with pytest.raises(UnavailableError, match=r"expert-parallel rank 1 \(pid \d+\) exited with status -9") as err:
        create_executor(ExecutorOptions(checkpoint=skewed_checkpoint, kv_cache_mb=2, ep=3, threads_per_rank=1))
    assert time.monotonic() - start < 20, "rank 0 waited out the rendezvous timeout"
    killer.join(1)
    assert killed and f"pid {killed[0]}" in str(err.value)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("moeslo-ep-rank")]


@pytest.mark.slow
def test_a_rank_that_cannot_load_its_experts_fails_the_start_with_its_error(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from contracts.errors import UnavailableError

    checkpoint = init_random_checkpoint(tmp_path / "ck", CONFIG, seed=5)
    tensors = load_file(checkpoint / "model.safetensors")
    missing = "model.layers.0.mlp.experts.7.up_proj.weight"  # expert 7 is rank 1's under the contiguous placement
    del tensors[missing]
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    start = time.monotonic()
    with pytest.raises(UnavailableError, match=r"expert-parallel rank 1 \(pid \d+\) exited with status 1") as err:
        create_executor(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=2, ep=2, threads_per_rank=1))
    assert time.monotonic() - start < 20
    assert missing in str(err.value)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("moeslo-ep-rank")]
