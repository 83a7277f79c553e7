"""What the engine reads from a checkpoint's tensors, and what it refuses to read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contracts.errors import ValidationError
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.executors import ExecutorOptions, create_executor

Tensors = dict[str, torch.Tensor]

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


def _wider(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every expert of every layer twice as wide: consistent, so only the config can tell."""
    return {k: torch.cat([v, v], 1 if "down_proj" in k else 0) for k, v in tensors.items() if ".experts." in k}


def _one(name: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Tensors], Tensors]:
    return lambda tensors: {name: edit(tensors[name])}


CORRUPTIONS: dict[str, Callable[[Tensors], Tensors]] = {
    "model.layers.0.mlp.gate.weight": _one("model.layers.0.mlp.gate.weight", lambda t: t[:3]),
    "lm_head.weight": _one("lm_head.weight", lambda t: t[:60]),
    "model.embed_tokens.weight": _one("model.embed_tokens.weight", lambda t: t[:60]),
    "model.layers.1.self_attn.q_proj.weight": _one("model.layers.1.self_attn.q_proj.weight", lambda t: t[:16]),
    "model.layers.1.self_attn.k_norm.weight": _one("model.layers.1.self_attn.k_norm.weight", lambda t: t[:8]),
    "model.norm.weight": _one("model.norm.weight", lambda t: torch.ones(16)),
    "model.layers.1.mlp.experts.3.down_proj.weight": _one("model.layers.1.mlp.experts.3.down_proj.weight",
                                                          lambda t: t.t()),
    "model.layers.0.mlp.experts.0.gate_proj.weight": _wider,  # the first expert tensor loaded
}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_tensor_of_the_wrong_shape_is_refused_at_load_naming_it_and_both_shapes(tmp_path: Path, name: str) -> None:
    init_random_checkpoint(tmp_path, TINY, seed=1, tokenizer=False)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    edit = {k: v.contiguous() for k, v in CORRUPTIONS[name](tensors).items()}
    _rewrite(tmp_path, edit)
    found, expected = tuple(edit[name].shape), tuple(tensors[name].shape)
    with pytest.raises(ValidationError) as info:
        create_executor(ExecutorOptions(checkpoint=tmp_path, kv_cache_mb=1))
    assert f"{name!r} has shape {found}, expected {expected}" in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"tie_word_embeddings": True, "mlp_only_layers": (1,)},
        {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24},  # GQA, head_dim not hidden/heads
        {"decoder_sparse_step": 2, "num_hidden_layers": 3},
    ],
)
def test_tied_dense_and_gqa_checkpoints_load(tmp_path: Path, changes: dict[str, object]) -> None:
    import dataclasses

    config = dataclasses.replace(TINY, **changes)  # type: ignore[arg-type]
    init_random_checkpoint(tmp_path, config, seed=1, tokenizer=False)
    executor = create_executor(ExecutorOptions(checkpoint=tmp_path, kv_cache_mb=1))
    executor.shutdown()
