"""What the engine reads from a checkpoint's tensors, and what it refuses to read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contracts.errors import ValidationError
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.executors import ExecutorOptions, create_executor

TINY = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
    max_position_embeddings=64,
)


def _rewrite(checkpoint: Path, edit: dict[str, torch.Tensor]) -> None:
    weights = checkpoint / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update(edit)
    save_file(tensors, str(weights), metadata={"format": "pt"})


def test_a_float8_tensor_is_refused_naming_it(tmp_path: Path) -> None:
    init_random_checkpoint(tmp_path, TINY, seed=1, tokenizer=False)
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    _rewrite(tmp_path, {name: load_file(str(tmp_path / "model.safetensors"))[name].to(torch.float8_e4m3fn)})
    with pytest.raises(ValidationError, match=rf"{name}.*F8_E4M3"):
        create_executor(ExecutorOptions(checkpoint=tmp_path, kv_cache_mb=1))
