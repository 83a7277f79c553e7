"""``moeslo bench step-profile``: the KV cache is sized for the checkpoint's model."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.step_profile import run
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig


def test_a_model_with_more_kv_per_token_than_the_default_is_profiled(tmp_path: Path) -> None:
    # Few small layers, but four times the default model's KV bytes per token (8 KV heads of 128).
    config = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                         num_experts=4, num_experts_per_tok=2)  # fmt: skip
    checkpoint = init_random_checkpoint(tmp_path / "ckpt", config, seed=0, tokenizer=False)
    threads = torch.get_num_threads()
    try:
        result = run(checkpoint, batch=4, prompt_len=100, steps=2, threads=1)
    finally:
        torch.set_num_threads(threads)
    assert result["batch"] == 4 and result["step_wall_ms"]["median"] > 0
