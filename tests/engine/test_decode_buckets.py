"""Decode attention in width buckets: a long context among short ones pads only its own bucket.

Every decoding sequence's logits must be those it gets decoded alone, whatever bucket it lands in.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.batch import SeqChunk, StepPlan
from engine.executors import ExecutorOptions, create_executor
from engine.model import BUCKET_MIN_KEYS
from tests.engine.helpers import run_sequences

# fp32 on CPU, as tests/engine/test_model.py: measured differences are ~1e-6 on logits of magnitude ~1.
ATOL = 1e-4
BLOCK = 16
# Contexts of 1, 29, 3 and 19 blocks: the 29- and 19-block ones are past BUCKET_MIN_KEYS (16 blocks)
# and share the next power-of-two class; the short two share the first.  Rows alternate between them.
LENGTHS = (12, 450, 40, 300)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in LENGTHS]


def _alone(checkpoint: Path, prompt: list[int], decode_steps: int) -> torch.Tensor:
    executor = create_executor(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=4, block_size=BLOCK))
    try:
        return run_sequences(executor, [prompt], decode_steps)
    finally:
        executor.shutdown()


def test_mixed_length_decode_steps_are_bucketed_without_padding_short_contexts(tiny_checkpoint: Path) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4, block_size=BLOCK))
    assert BUCKET_MIN_KEYS == 256
    plan = StepPlan(tuple(SeqChunk(i, n, (1,), tuple(range(i * 40, i * 40 + 40)), True)
                          for i, n in enumerate(LENGTHS)))
    buckets = executor.model.step_metadata(plan, BLOCK, executor.num_blocks).decode_buckets
    executor.shutdown()
    assert [b.rows.tolist() for b in buckets] == [[0, 2], [1, 3]]
    assert [tuple(b.block_tables.shape) for b in buckets] == [(2, 3), (2, 29)]
    assert [b.mask.shape[-1] for b in buckets] == [3 * BLOCK, 29 * BLOCK]
    assert buckets[1].mask[1].sum() == 301  # the 300-token context and the token decoding now


def test_similar_contexts_stay_one_bucket(tiny_checkpoint: Path) -> None:
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4, block_size=BLOCK))
    plan = StepPlan(tuple(SeqChunk(i, n, (1,), tuple(range(i * 20, i * 20 + 20)), True)
                          for i, n in enumerate((3, 250, 40, 17))))
    meta = executor.model.step_metadata(plan, BLOCK, executor.num_blocks)
    executor.shutdown()
    assert meta.decode_only and len(meta.decode_buckets) == 1
    assert meta.decode_buckets[0].rows.tolist() == [0, 1, 2, 3]


def test_a_bucketed_decode_batch_gives_each_sequence_its_logits_alone(tiny_checkpoint: Path) -> None:
    prompts, steps = _prompts(), 4
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4, block_size=BLOCK))
    batched = run_sequences(executor, prompts, steps).view(steps + 1, len(prompts), -1)
    executor.shutdown()
    for i, prompt in enumerate(prompts):
        alone = _alone(tiny_checkpoint, prompt, steps)
        torch.testing.assert_close(batched[:, i], alone, atol=ATOL, rtol=0)
        assert batched[:, i].argmax(-1).tolist() == alone.argmax(-1).tolist()  # greedy outputs unchanged


def test_bucketed_decodes_beside_a_prefill_chunk_give_their_logits_alone(tiny_checkpoint: Path) -> None:
    """Decodes in two buckets scattered back around a chunked-prefill continuation in the same step."""
    short, long, other = _prompts()[:3]
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4, block_size=BLOCK))
    tables = [tuple(range(i * 100, i * 100 + 100)) for i in range(3)]
    first = executor.execute(StepPlan((SeqChunk(0, 0, tuple(short), tables[0], True),
                                       SeqChunk(1, 0, tuple(long), tables[1], True),
                                       SeqChunk(2, 0, tuple(other[:20]), tables[2], False))))
    tokens = first.argmax(-1).tolist()
    mixed = executor.execute(StepPlan((SeqChunk(1, len(long), (tokens[1],), tables[1], True),
                                       SeqChunk(2, 20, tuple(other[20:]), tables[2], True),
                                       SeqChunk(0, len(short), (tokens[0],), tables[0], True))))
    meta = executor.model.step_metadata(StepPlan((SeqChunk(1, len(long), (tokens[1],), tables[1], True),
                                                  SeqChunk(0, len(short), (tokens[0],), tables[0], True))),
                                        BLOCK, executor.num_blocks)
    executor.shutdown()
    assert len(meta.decode_buckets) == 2
    torch.testing.assert_close(mixed[0], _alone(tiny_checkpoint, long, 1)[1], atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed[1], _alone(tiny_checkpoint, other, 0)[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed[2], _alone(tiny_checkpoint, short, 1)[1], atol=ATOL, rtol=0)
