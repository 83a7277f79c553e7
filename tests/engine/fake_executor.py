"""A tiny deterministic executor for scheduler/engine unit tests (integration tests use the real one).

It keeps a token-id "KV cache" in the blocks the plan names and produces
logits from what it reads back, so a block-table mistake (shared or stale
blocks, wrong recompute) changes the output and fails the tests.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from contracts.errors import PlacementError
from contracts.placement import Placement
from engine.batch import StepPlan
from engine.config import ModelConfig
from engine.stats import PlacementSwapStats, RoutingDelta


class FakeExecutor:
    def __init__(self, *, num_blocks: int = 64, block_size: int = 4, vocab_size: int = 64,
                 max_len: int = 256, step_delay_s: float = 0.0, fail_on_step: int | None = None) -> None:
        self._config = ModelConfig(
            vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=8, intermediate_size=16, max_position_embeddings=max_len,
        )
        self._num_blocks = num_blocks
        self._block_size = block_size
        self.kv = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self._placement = Placement.contiguous(2, 4, 1)
        self.step_delay_s = step_delay_s
        self.fail_on_step = fail_on_step
        self.steps = 0
        self.plans: list[StepPlan] = []
        self.routing_on = True
        self.shut_down = False
        self.broken: str | None = None
        """Why it can no longer run steps (the executor interface's; None: healthy)."""
        self.started = threading.Event()

    @property
    def config(self) -> ModelConfig:
        return self._config

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_ranks(self) -> int:
        return 1

    @property
    def placement(self) -> Placement:
        return self._placement

    def execute(self, plan: StepPlan) -> torch.Tensor:
        self.started.set()
        self.steps += 1
        self.plans.append(plan)
        if self.fail_on_step is not None and self.steps == self.fail_on_step:
            raise RuntimeError("injected executor failure")
        if self.step_delay_s:
            threading.Event().wait(self.step_delay_s)
        rows = []
        bs = self._block_size
        for chunk in plan.chunks:
            end = chunk.num_computed + len(chunk.token_ids)
            assert len(chunk.block_table) * bs >= end, "block table does not cover the chunk"
            for i, tok in enumerate(chunk.token_ids):
                pos = chunk.num_computed + i
                self.kv[chunk.block_table[pos // bs], pos % bs] = tok
            ends = range(chunk.num_computed + 1, end + 1) if chunk.all_logits else [end] if chunk.needs_logits else []
            for stop in ends:
                context = [int(self.kv[chunk.block_table[p // bs], p % bs]) for p in range(stop)]
                assert min(context) >= 0, "read a KV slot that was never written"
                nxt = (sum(context) * 31 + stop) % self._config.vocab_size
                row = torch.full((self._config.vocab_size,), -10.0)
                row[nxt] = 10.0
                rows.append(row)
        if not rows:
            return torch.empty((0, self._config.vocab_size))
        return torch.stack(rows)

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        placement.validate(num_layers=2, num_experts=4, num_ranks=1)
        if placement == self._placement:
            raise PlacementError("same placement")
        self._placement = placement
        return PlacementSwapStats(duration_s=0.001, experts_moved=2, bytes_moved=100)

    def take_routing(self) -> RoutingDelta | None:
        if not self.routing_on:
            return None
        return RoutingDelta(expert_tokens=np.array([[2, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64),
                            rank_tokens=np.array([[4], [4]], dtype=np.int64))

    def set_routing_stats(self, enabled: bool) -> None:
        self.routing_on = enabled

    def shutdown(self) -> None:
        self.shut_down = True


def reference_tokens(prompt: list[int], max_tokens: int, vocab_size: int = 64) -> list[int]:
    """What FakeExecutor + greedy sampling must generate for ``prompt``, whatever the batching."""
    tokens = list(prompt)
    out = []
    for _ in range(max_tokens):
        nxt = (sum(tokens) * 31 + len(tokens)) % vocab_size
        out.append(nxt)
        tokens.append(nxt)
    return out
