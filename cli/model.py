"""``moeslo model``: make Qwen3-MoE checkpoints (``init``: a small random one)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import cli_errors, console, nonempty, print_json

if TYPE_CHECKING:
    from engine.config import ModelConfig

model_app = typer.Typer(help="Make Qwen3-MoE checkpoints (Hugging Face format): init writes a small random one.",
                        no_args_is_help=True)  # fmt: skip

_PART_OPTIONS = {
    "embeddings": "--vocab x --hidden", "experts": "--layers x --experts x --moe-intermediate x --hidden",
    "attention": "--layers x (--heads + --kv-heads) x --head-dim x --hidden", "dense_mlp": "--hidden",
    "routers": "--experts x --hidden", "norms": "--layers x --hidden",
}
"""The options that size each part of the parameter count (``count_parameters``'s parts)."""


def _vocab(value: int) -> int:
    """An option's callback: a vocabulary with an id for each byte, which the engine's tokenizers need."""
    from engine.tokenizer import BYTE_VOCAB_SIZE

    if value < BYTE_VOCAB_SIZE:
        raise typer.BadParameter(f"must be {BYTE_VOCAB_SIZE} or more (an id for each byte: moeslo serve refuses a "
                                 f"smaller vocabulary), got {value}")
    return value


@model_app.command("init")
def init(
    out: Annotated[str, typer.Option(help="Directory to write config.json and model.safetensors into.",
                                     callback=nonempty)],
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 4,
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 256,
    experts: Annotated[int, typer.Option(help="Routed experts per MoE layer.")] = 32,
    top_k: Annotated[int, typer.Option(help="Experts per token.")] = 4,
    moe_intermediate: Annotated[int, typer.Option(help="Expert MLP width.")] = 128,
    vocab: Annotated[int, typer.Option(callback=_vocab, help="Vocabulary size (256 or more).")] = 4096,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 8,
    kv_heads: Annotated[int, typer.Option(help="Key/value heads (GQA).")] = 4,
    head_dim: Annotated[int, typer.Option(help="Per-head dimension (even: rotary embeddings pair its halves).")] = 32,
    max_positions: Annotated[int, typer.Option(help="Context length.")] = 4096,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    router_skew: Annotated[float, typer.Option(help="0: near-uniform routing; 1: Zipf-like hot experts.")] = 0.0,
    prompt_kinds: Annotated[
        int, typer.Option(help="Equal token ranges whose prompts favour different experts (with --router-skew).")
    ] = 1,
    seed: Annotated[int, typer.Option(help="Random seed (fixed: same seed, same weights).")] = 0,
    tokenizer: Annotated[bool, typer.Option(
        help="Also train a byte-level BPE tokenizer.json of the vocabulary size, with a chat template.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Write a small random Qwen3-MoE checkpoint that transformers and vLLM load unchanged."""
    with cli_errors():
        from engine.checkpoint import count_parameters, init_random_checkpoint
        from engine.config import ModelConfig
        from engine.tokenizer_init import MIN_VOCAB_SIZE

        config = ModelConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k,
            moe_intermediate_size=moe_intermediate, vocab_size=vocab, num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_positions,
            torch_dtype=dtype, intermediate_size=3 * hidden,
        )
        params = count_parameters(config)
        _check_memory(config, params)
        init_random_checkpoint(Path(out), config, seed=seed, router_skew=router_skew, prompt_kinds=prompt_kinds,
                               tokenizer=tokenizer, name_eos=True)
        summary = {"out": str(out), "parameters": sum(params.values()), "by_part": params,
                   "layers": layers, "experts": experts, "top_k": top_k, "router_skew": router_skew,
                   "prompt_kinds": prompt_kinds, "tokenizer": tokenizer and vocab >= MIN_VOCAB_SIZE}
        if json_out:
            print_json(summary)
            return
        console.print(f"wrote {out} ({summary['parameters']:,} parameters)")
        if tokenizer and not summary["tokenizer"]:
            console.print(f"no tokenizer written: a BPE tokenizer needs --vocab {MIN_VOCAB_SIZE} or more; this "
                          "checkpoint gets the engine's byte-level tokenizer and serves no chat", soft_wrap=True)


def _check_memory(config: ModelConfig, params: dict[str, int]) -> None:
    """Refuse, before anything is allocated or written, sizes whose weights the free memory cannot hold."""
    import psutil

    from contracts.errors import ValidationError
    from engine.checkpoint import checkpoint_bytes

    need, available = checkpoint_bytes(config), psutil.virtual_memory().available
    if need > available:
        part = max(params, key=lambda name: params[name])
        raise ValidationError(
            f"these sizes need {_size(need)} of memory ({sum(params.values()):,} parameters at "
            f"{config.torch_dtype}, most of them {part}: {_PART_OPTIONS.get(part, '--hidden')}), and "
            f"{_size(available)} is available: choose smaller sizes"
        )


def _size(count: int) -> str:
    """Bytes in KiB, MiB, GiB or TiB, the largest unit under 1024 of (TiB beyond)."""
    value, units = count / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:,.1f} {units[0]}"
