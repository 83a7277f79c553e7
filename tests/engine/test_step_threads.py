"""Threads per step: small steps run on one thread, large ones on all, with the same logits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from contracts.errors import ValidationError
from engine.batch import SeqChunk, StepPlan
from engine.executors import ExecutorOptions, create_executor
from tests.engine.helpers import run_sequences


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _prefill(tokens: int) -> StepPlan:
    return StepPlan((SeqChunk(0, 0, tuple(range(1, tokens + 1)), tuple(range(8)), True),))


def test_steps_under_the_threshold_run_on_one_thread(tiny_checkpoint: Path) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=2, threads_per_rank=2,
                                               parallel_min_tokens=20))
    try:
        seen = []
        for tokens in (19, 20, 5, 64):
            executor.execute(_prefill(tokens))
            seen.append(torch.get_num_threads())
        assert seen == [1, 2, 1, 2]
        # Whoever embeds the executor may set torch's threads between steps: the next step sets its own.
        torch.set_num_threads(2)
        executor.execute(_prefill(3))
        assert torch.get_num_threads() == 1
    finally:
        executor.shutdown()


def test_threshold_zero_keeps_every_step_on_all_threads(tiny_checkpoint: Path) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=2, threads_per_rank=2,
                                               parallel_min_tokens=0))
    try:
        executor.execute(_prefill(1))
        assert torch.get_num_threads() == 2
    finally:
        executor.shutdown()


def test_logits_do_not_depend_on_the_threads_a_step_ran_on(tiny_checkpoint: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (40, 7, 25)]
    outputs = []
    for threshold in (0, 10_000):  # every step on 2 threads, then every step on one
        executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=2, threads_per_rank=2,
                                                   parallel_min_tokens=threshold))
        try:
            outputs.append(run_sequences(executor, prompts, decode_steps=4))
        finally:
            executor.shutdown()
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(outputs[0].argmax(-1), outputs[1].argmax(-1))


def test_negative_threshold_is_refused(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValidationError, match="parallel_min_tokens"):
        create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=2, parallel_min_tokens=-1))


def test_the_threshold_reaches_the_engine_core_process() -> None:
    from engine.core_proc import CoreOptions
    from engine.engine_types import EngineConfig

    options = CoreOptions(executor=ExecutorOptions(checkpoint=Path("ckpt"), parallel_min_tokens=5),
                          engine=EngineConfig(), input_address="ipc://in", output_address="ipc://out", parent_pid=1)
    assert CoreOptions.from_json(options.to_json()).executor.parallel_min_tokens == 5
