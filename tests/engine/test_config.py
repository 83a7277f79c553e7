"""ModelConfig reads config.json as transformers' Qwen3MoeConfig does."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from engine.config import ModelConfig

TINY = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=8, num_experts_per_tok=2,
    max_position_embeddings=64,
)


def _load(tmp_path: Path, raw: dict[str, Any]) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return ModelConfig.load(tmp_path)


def test_a_config_transformers_saved_reads_back_the_same(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    for experts in (8, 64):  # transformers 5 writes num_local_experts, its name for num_experts
        config = ModelConfig(**{**asdict(TINY), "num_experts": experts})
        transformers.Qwen3MoeConfig(**config.to_hf_dict()).save_pretrained(tmp_path)
        assert ModelConfig.load(tmp_path) == config


def test_num_local_experts_is_num_experts_and_disagreeing_names_are_refused(tmp_path: Path) -> None:
    from contracts.errors import ValidationError

    raw = TINY.to_hf_dict()
    raw["num_local_experts"] = raw.pop("num_experts")
    loaded = _load(tmp_path, raw)
    assert loaded.num_experts == 8 and "num_local_experts" not in loaded.to_hf_dict()
    with pytest.raises(ValidationError, match="num_local_experts"):
        _load(tmp_path, {**raw, "num_experts": 16})


def test_keys_left_out_take_qwen3moeconfigs_defaults_not_model_inits(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    raw = TINY.to_hf_dict()
    for key in ("norm_topk_prob", "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps",
                "decoder_sparse_step", "mlp_only_layers", "tie_word_embeddings"):
        raw.pop(key)
    ours = _load(tmp_path, raw)
    theirs = transformers.Qwen3MoeConfig.from_pretrained(tmp_path)
    assert ours.norm_topk_prob is theirs.norm_topk_prob is False
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 10_000.0
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert (ours.rms_norm_eps, ours.decoder_sparse_step) == (theirs.rms_norm_eps, theirs.decoder_sparse_step)
    assert list(ours.mlp_only_layers) == theirs.mlp_only_layers
    assert ours.tie_word_embeddings is theirs.tie_word_embeddings
    empty = _load(tmp_path, {"model_type": "qwen3_moe"})
    full = transformers.Qwen3MoeConfig()
    assert (empty.num_experts, empty.hidden_size, empty.vocab_size) == (
        full.num_experts, full.hidden_size, full.vocab_size)
    assert empty.head_dim == full.hidden_size // full.num_attention_heads


def test_model_init_keeps_its_own_defaults_and_writes_every_key() -> None:
    raw = ModelConfig().to_hf_dict()
    assert raw["norm_topk_prob"] is True and raw["rope_theta"] == 1_000_000.0 and raw["num_experts"] == 32
    assert ModelConfig.from_dict(raw) == ModelConfig()


@pytest.mark.parametrize("key", ["quantization_config", "compression_config"])
def test_a_quantized_checkpoint_is_refused(tmp_path: Path, key: str) -> None:
    from contracts.errors import ValidationError

    quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValidationError, match=r"quantized checkpoints \(fp8\) are not supported.*vLLM"):
        _load(tmp_path, {**TINY.to_hf_dict(), key: quant})


def test_options_the_engine_does_not_implement_are_refused_naming_each(tmp_path: Path) -> None:
    from contracts.errors import ValidationError

    raw = TINY.to_hf_dict()
    assert _load(tmp_path, {**raw, "hidden_act": "swish"}) == TINY  # transformers' other name for silu
    unsupported = {"attention_bias": True, "hidden_act": "gelu", "use_sliding_window": True}
    with pytest.raises(ValidationError) as info:
        _load(tmp_path, {**raw, **unsupported})
    assert len(info.value.problems) == 3
    for key in unsupported:
        assert any(key in problem for problem in info.value.problems)
