"""Model configuration: the fields of Hugging Face's ``Qwen3MoeConfig`` the engine uses."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from contracts.errors import ValidationError

# What transformers' Qwen3MoeConfig (5.x) takes for a key config.json leaves out; the dataclass defaults
# below are `moeslo model init`'s, which writes every key, so a checkpoint is read as transformers reads it.
_READ_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151_936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": (),
    "rms_norm_eps": 1e-6, "rope_theta": 10_000.0, "max_position_embeddings": 32_768,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
_ALIASES = {"num_local_experts": "num_experts"}
"""Other names of a field: transformers 5 writes num_experts as num_local_experts (its attribute_map)."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Qwen3-MoE architecture, named as in ``config.json``.

    Defaults are the small random checkpoint of ``moeslo model init``; :meth:`from_dict` reads a key
    that ``config.json`` leaves out as transformers does, with Qwen3MoeConfig's default.
    """

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    """Width of the dense MLP in layers that are not sparse."""
    moe_intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 32
    num_experts: int = 32
    num_experts_per_tok: int = 4
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Keys of config.json the engine does not use, kept so a round trip loses nothing."""

    def __post_init__(self) -> None:
        problems = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "decoder_sparse_step", "max_position_embeddings"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_experts_per_tok > self.num_experts:
            problems.append(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be <= num_experts ({self.num_experts})"
            )
        if self.num_key_value_heads >= 1 and self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            problems.append(f"head_dim must be even (rotary embeddings pair its halves), got {self.head_dim}")
        if self.torch_dtype not in ("float32", "bfloat16", "float16"):
            problems.append(f"torch_dtype must be float32, bfloat16 or float16, got {self.torch_dtype!r}")
        if problems:
            raise ValidationError(problems)

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether ``layer`` uses the MoE block (transformers' rule)."""
        return layer not in self.mlp_only_layers and (
            self.num_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_sparse_layer(i))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """The config of a ``config.json``: keys it leaves out take Qwen3MoeConfig's defaults."""
        if problems := _unimplemented(raw):
            raise ValidationError(problems)
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {**_READ_DEFAULTS, **_aliased(raw)}
        kwargs.update({k: v for k, v in raw.items() if k in known and v is not None})
        if raw.get("head_dim") is None:  # transformers' fallback when config.json names none
            kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        kwargs["mlp_only_layers"] = tuple(kwargs["mlp_only_layers"] or ())
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        kwargs["torch_dtype"] = str(raw.get("torch_dtype") or raw.get("dtype") or "float32")
        # transformers 5 writes RoPE settings under rope_parameters; older configs use rope_scaling.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ValidationError(f"rope_parameters must be an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValidationError(
                f"rope_type {rope_type!r} is not supported (only 'default' RoPE); refusing rather than "
                "computing wrong positions"
            )
        if raw.get("rope_theta") is None and "rope_theta" in rope:
            kwargs["rope_theta"] = float(rope["rope_theta"])
        kwargs["extra"] = {k: v for k, v in raw.items() if k not in known and k not in _ALIASES}
        return cls(**kwargs)

    @classmethod
    def load(cls, checkpoint_dir: str | Path) -> ModelConfig:
        path = Path(checkpoint_dir) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ValidationError(f"{path} not found: is {checkpoint_dir} a checkpoint directory?") from exc
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path} is not valid JSON: {exc}") from exc
        model_type = raw.get("model_type")
        if model_type not in (None, "qwen3_moe"):
            raise ValidationError(f"{path}: model_type is {model_type!r}, only 'qwen3_moe' is supported")
        if raw.get("quantization_config") or raw.get("compression_config"):
            # Their weights need scales the engine never applies: refuse rather than serve garbage.
            raise ValidationError(
                f"{path}: quantized checkpoints (fp8) are not supported by the embedded engine; serve them with vLLM"
            )
        return cls.from_dict(raw)

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content that transformers' Qwen3MoeConfig reads."""
        out = dict(self.extra)
        out.update({k: v for k, v in asdict(self).items() if k != "extra"})
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        out.update(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "hidden_act": "silu",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "output_router_logits": False,
                "router_aux_loss_coef": 0.001,
                "use_cache": True,
                "use_sliding_window": False,
            }
        )
        out.setdefault("rope_scaling", None)
        return out


def _aliased(raw: dict[str, Any]) -> dict[str, Any]:
    """Fields config.json names by another name; refused where both names are there and disagree."""
    out: dict[str, Any] = {}
    for alias, name in _ALIASES.items():
        if raw.get(alias) is None:
            continue
        if raw.get(name) is not None and raw[name] != raw[alias]:
            raise ValidationError(f"{name} ({raw[name]}) and {alias} ({raw[alias]}) disagree")
        out[name] = raw[alias]
    return out


def _unimplemented(raw: dict[str, Any]) -> list[str]:
    """Options of Qwen3MoeConfig the engine does not implement: refused rather than silently ignored."""
    problems = []
    if raw.get("attention_bias"):
        problems.append("attention_bias: true is not supported (the engine's q/k/v/o projections have no bias)")
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        problems.append(f"hidden_act {raw['hidden_act']!r} is not supported (only 'silu')")
    if raw.get("use_sliding_window"):
        problems.append("use_sliding_window: true is not supported (the engine attends over the whole context)")
    return problems
