"""Hugging Face checkpoints of Qwen3-MoE: read selectively, and write small random ones.

Tensor names are those of transformers' ``Qwen3MoeForCausalLM`` in the hub
format (one tensor per expert projection), so a real Qwen3-MoE checkpoint
directory (``config.json`` + ``model.safetensors`` or sharded with
``model.safetensors.index.json``) loads unchanged.  A rank reads only the
tensors it holds: expert weights are looked up by name, one expert at a time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from contracts.errors import ValidationError
from engine.config import ModelConfig
from engine.tokenizer_init import MIN_VOCAB_SIZE, eos_token_id, write_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_STORED_DTYPES = ("F32", "BF16", "F16")
"""safetensors' names of the dtypes a tensor may be stored in: a float8 or integer one is quantized."""


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValidationError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}") from None


def expert_tensor_name(layer: int, expert: int, proj: str) -> str:
    """Hub name of one expert projection (``gate_proj``, ``up_proj`` or ``down_proj``)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"


class CheckpointReader:
    """Lazy, name-addressed access to the tensors of a checkpoint directory."""

    def __init__(self, directory: str | Path, dtype: torch.dtype) -> None:
        self.directory = Path(directory)
        self.dtype = dtype
        self.config = ModelConfig.load(self.directory)
        """The checkpoint's config, for the shapes its tensors must have."""
        index = self.directory / "model.safetensors.index.json"
        single = self.directory / "model.safetensors"
        if index.exists():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: self.directory / fname for name, fname in weight_map.items()}
        elif single.exists():
            self._file_of = {}
            self._single: Path | None = single
        else:
            raise ValidationError(
                f"{self.directory} holds neither model.safetensors nor model.safetensors.index.json"
            )
        if index.exists():
            self._single = None
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}
        if self._single is not None:
            handle = self._open(self._single)
            self._file_of = {name: self._single for name in handle.keys()}  # noqa: SIM118 (not iterable)

    def _open(self, path: Path) -> Any:
        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
        return self._handles[path]

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Tensor ``name`` at the reader's dtype; refused unless stored in ``shape`` (the config's)."""
        try:
            path = self._file_of[name]
        except KeyError:
            raise ValidationError(f"checkpoint {self.directory} has no tensor {name!r}") from None
        handle = self._open(path)
        stored_slice = handle.get_slice(name)
        found = tuple(stored_slice.get_shape())
        if found != shape:  # caught here, it names the tensor; later it is an opaque matmul error, or none
            raise ValidationError(
                f"checkpoint {self.directory}: tensor {name!r} has shape {found}, expected {shape} from "
                "config.json"
            )
        stored = stored_slice.get_dtype()
        if stored not in _STORED_DTYPES:  # cast up without its scales, a quantized weight is garbage
            raise ValidationError(
                f"checkpoint {self.directory}: tensor {name!r} is {stored}; the embedded engine reads only "
                "float16, bfloat16 and float32 weights (serve quantized checkpoints with vLLM)"
            )
        tensor: torch.Tensor = handle.get_tensor(name)
        return tensor.to(self.dtype)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kind_directions(config: ModelConfig, seed: int, kinds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt kind after the first: a unit direction (kinds-1, hidden) and an expert popularity order.

    Drawn from their own generator, so one kind gives exactly the tensors it always gave.
    """
    gen = torch.Generator().manual_seed(seed + 7919)
    directions = torch.randn(kinds - 1, config.hidden_size, generator=gen)
    directions /= directions.norm(dim=1, keepdim=True)
    orders = torch.stack([torch.randperm(config.num_experts, generator=gen) for _ in range(kinds - 1)])
    return directions, orders


def _skewed_router(
    noise: torch.Tensor, router_skew: float, skews: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Router rows from standard-normal ``noise`` (experts x hidden) and, per prompt kind, a popularity
    over the experts and the hidden direction its tokens carry."""
    hidden = noise.shape[1]
    # Unit-variance logits per token, like a trained router's spread.
    router: torch.Tensor = noise / hidden**0.5
    for popularity, direction in skews:
        # Expert e gains about 2 * router_skew * popularity[e] nats for every token of the kind.
        bias = 2.0 * router_skew * popularity / (0.7 * hidden**0.5)
        router += bias[:, None] * direction[None, :]
    return router


def _random_tensors(
    config: ModelConfig, seed: int, router_skew: float, prompt_kinds: int = 1
) -> Iterator[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    std = 0.02
    hidden, head_dim = config.hidden_size, config.head_dim

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    # A shared direction in every token's hidden state, and router rows that
    # favour it unequally, give the Zipf-like expert popularity of real MoE
    # routing (a random router alone routes almost uniformly).
    direction = torch.randn(hidden, generator=gen)
    direction /= direction.norm()
    embed = normal(config.vocab_size, hidden)
    # Prompt kinds: the vocabulary in equal token ranges; tokens of range j > 0 carry direction j
    # instead of the shared one, and the routers favour their own popularity order along it.
    kind_of = torch.arange(config.vocab_size) * prompt_kinds // config.vocab_size
    extra_dirs, extra_orders = _kind_directions(config, seed, prompt_kinds) if prompt_kinds > 1 else (None, None)
    kind_dirs = [direction] if extra_dirs is None else [direction, *extra_dirs]
    if router_skew > 0:
        # As long as the random part: after RMSNorm every token has ~0.7 sqrt(hidden) along it.
        for kind, kind_dir in enumerate(kind_dirs):
            embed[kind_of == kind] += std * hidden**0.5 * kind_dir
    yield "model.embed_tokens.weight", embed
    zipf = 1.0 / torch.arange(1, config.num_experts + 1, dtype=torch.float32) ** 0.8
    popularity = zipf[torch.randperm(config.num_experts, generator=gen)]
    # Per prompt kind, the experts' popularity and the direction its tokens carry (none: uniform router).
    orders = [] if extra_orders is None else [zipf[order] for order in extra_orders]
    skews = list(zip([popularity, *orders], kind_dirs, strict=True)) if router_skew > 0 else []
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        yield f"{prefix}.input_layernorm.weight", torch.ones(hidden)
        yield f"{prefix}.post_attention_layernorm.weight", torch.ones(hidden)
        yield f"{prefix}.self_attn.q_proj.weight", normal(config.num_attention_heads * head_dim, hidden)
        yield f"{prefix}.self_attn.k_proj.weight", normal(config.num_key_value_heads * head_dim, hidden)
        yield f"{prefix}.self_attn.v_proj.weight", normal(config.num_key_value_heads * head_dim, hidden)
        yield f"{prefix}.self_attn.o_proj.weight", normal(hidden, config.num_attention_heads * head_dim)
        yield f"{prefix}.self_attn.q_norm.weight", torch.ones(head_dim)
        yield f"{prefix}.self_attn.k_norm.weight", torch.ones(head_dim)
        if config.is_sparse_layer(layer):
            noise = torch.randn(config.num_experts, hidden, generator=gen)
            yield f"{prefix}.mlp.gate.weight", _skewed_router(noise, router_skew, skews)
            inter = config.moe_intermediate_size
            for expert in range(config.num_experts):
                yield expert_tensor_name(layer, expert, "gate_proj"), normal(inter, hidden)
                yield expert_tensor_name(layer, expert, "up_proj"), normal(inter, hidden)
                yield expert_tensor_name(layer, expert, "down_proj"), normal(hidden, inter)
        else:
            inter = config.intermediate_size
            yield f"{prefix}.mlp.gate_proj.weight", normal(inter, hidden)
            yield f"{prefix}.mlp.up_proj.weight", normal(inter, hidden)
            yield f"{prefix}.mlp.down_proj.weight", normal(hidden, inter)
    yield "model.norm.weight", torch.ones(hidden)
    if not config.tie_word_embeddings:
        yield "lm_head.weight", normal(config.vocab_size, hidden)


def init_random_checkpoint(
    out_dir: str | Path, config: ModelConfig, *, seed: int = 0, router_skew: float = 0.0, prompt_kinds: int = 1,
    tokenizer: bool = True, name_eos: bool = False,
) -> Path:
    """Write a random Qwen3-MoE checkpoint in the Hugging Face format; return its directory.

    ``tokenizer`` also writes a byte-level BPE ``tokenizer.json`` of the
    model's vocabulary size and a ``tokenizer_config.json`` with a chat
    template (:mod:`engine.tokenizer_init`); without them the engine falls
    back to its byte-level tokenizer and serves no chat.  With them and
    ``name_eos`` (as ``moeslo model init`` asks), a config that names no
    ``eos_token_id`` gets the tokenizer's ``<|endoftext|>`` (in ``config.json``
    and ``generation_config.json``), so engines stop there.  Off by default:
    a random model samples that token about once in 400, and what counts
    generated tokens (tests, benchmarks) wants each request to run its length.

    ``router_skew`` > 0 makes some experts popular for every token, as real
    routing is; 0 gives a nearly uniform router.  ``prompt_kinds`` > 1 splits
    the vocabulary into that many equal token ranges whose tokens favour
    different experts (with ``router_skew`` > 0), so load that shifts between
    kinds of prompt moves the hot experts; 1 gives the tensors it always gave.

    A write that fails (torch's allocator refusing is a ``MemoryError``)
    removes the folders it made; :func:`checkpoint_bytes` is the memory it needs.
    """
    problems = []
    if not (math.isfinite(router_skew) and router_skew >= 0):
        problems.append(f"router_skew must be a finite number >= 0, got {router_skew}")
    if not 1 <= prompt_kinds <= config.vocab_size:
        problems.append(f"prompt_kinds must be in [1, {config.vocab_size}], got {prompt_kinds}")
    if problems:
        raise ValidationError(problems)
    if name_eos and tokenizer and config.vocab_size >= MIN_VOCAB_SIZE and config.eos_token_id is None:
        config = dataclasses.replace(config, eos_token_id=eos_token_id(config.vocab_size))
    out = Path(out_dir)
    created = _topmost_missing(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        _write_checkpoint(out, config, seed, router_skew, prompt_kinds, tokenizer=tokenizer, name_eos=name_eos)
    except BaseException:
        if created is not None:  # nothing of a failed write stays behind in folders it made
            shutil.rmtree(created, ignore_errors=True)
        raise
    return out


def _topmost_missing(path: Path) -> Path | None:
    """The outermost folder that making ``path`` would create (None: it exists already)."""
    missing = None
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _write_checkpoint(
    out: Path, config: ModelConfig, seed: int, router_skew: float, prompt_kinds: int, *, tokenizer: bool,
    name_eos: bool,
) -> None:
    dtype = torch_dtype(config.torch_dtype)
    try:
        tensors = {
            name: t.to(dtype).contiguous() for name, t in _random_tensors(config, seed, router_skew, prompt_kinds)
        }
    except RuntimeError as exc:  # torch's CPU allocator refusing: a MemoryError, as numpy would raise
        if "allocate" not in str(exc):
            raise
        raise MemoryError(str(exc).split("DefaultCPUAllocator: ")[-1].strip()) from exc
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = config.to_hf_dict()
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_theta}
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    # safetensors writes its file 0600: give it the mode of the files open() writes (0666 less the
    # umask), so a server running as another user (a container's) can read the weights too.
    (out / "model.safetensors").chmod((out / "config.json").stat().st_mode & 0o777)
    generation = {"do_sample": False}
    if config.eos_token_id is not None:
        generation["eos_token_id"] = config.eos_token_id  # type: ignore[assignment]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if not (tokenizer and write_tokenizer(out, config.vocab_size, max_model_len=config.max_position_embeddings,
                                           name_eos=name_eos)):
        # A tokenizer left from an earlier checkpoint in this folder would be served with this model.
        for name in TOKENIZER_FILES:
            (out / name).unlink(missing_ok=True)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def count_parameters(config: ModelConfig) -> dict[str, int]:
    """Parameter counts by part, for reports."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attn = hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    expert = 3 * hidden * config.moe_intermediate_size
    sparse = len(config.sparse_layers)
    dense = config.num_hidden_layers - sparse
    embed = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return {
        "attention": attn * config.num_hidden_layers,
        "experts": expert * config.num_experts * sparse,
        "routers": hidden * config.num_experts * sparse,
        "dense_mlp": 3 * hidden * config.intermediate_size * dense,
        "embeddings": embed,
        # two RMSNorms per layer and the final one, and Qwen3's per-head query and key norms
        "norms": (2 * config.num_hidden_layers + 1) * hidden + 2 * head_dim * config.num_hidden_layers,
    }


def checkpoint_bytes(config: ModelConfig) -> int:
    """Memory :func:`init_random_checkpoint` holds at its peak: every weight at the checkpoint's dtype, and
    the largest tensor (every one is hidden x something) once more in float32 while it is drawn."""
    widest = max(config.vocab_size, config.intermediate_size, config.moe_intermediate_size, config.num_experts,
                 config.num_attention_heads * config.head_dim)  # fmt: skip
    return sum(count_parameters(config).values()) * torch_dtype(config.torch_dtype).itemsize + (
        4 * config.hidden_size * widest)

