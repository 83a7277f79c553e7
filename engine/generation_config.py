"""A checkpoint's generation settings, read as vLLM reads them: which tokens end a sequence, and sampling defaults.

A sequence ends at the tokenizer's eos token (``tokenizer_config.json``'s
``eos_token``, else ``special_tokens_map.json``'s, looked up in ``tokenizer.json``) and at every id of
``generation_config.json``'s ``eos_token_id`` (an id or a list of them;
``config.json``'s when the checkpoint has no ``generation_config.json``, as
transformers falls back), unless a request sets ``ignore_eos``.  This is what
vLLM does (``SamplingParams.update_from_generation_config``), and what
transformers' ``generate`` does for the generation config's ids.

Its sampling settings (``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``;
``max_new_tokens`` as a chat's ``max_tokens``) are the defaults of requests
that leave them out, as vLLM's default ``--generation-config auto`` makes them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from contracts.errors import ValidationError
from engine.chat_template import token_text
from engine.sampling import SamplingParams

SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                         "frequency_penalty")
"""generation_config.json's settings that become request defaults (with ``max_new_tokens``)."""
INTEGER_KEYS = ("max_tokens", "top_k")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no such file."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValidationError(f"{path} must hold a JSON object")
    return raw


def generation_config(checkpoint: Path) -> dict[str, Any]:
    """``generation_config.json``'s settings; without the file, ``config.json``'s ``eos_token_id``."""
    directory = Path(checkpoint)
    own = read_json_object(directory / "generation_config.json")
    model = read_json_object(directory / "config.json") or {}
    if own is not None and own.get("eos_token_id") is not None:
        return own
    # A generation config naming no eos keeps config.json's (as transformers' from_model_config fills it).
    eos = {"eos_token_id": model["eos_token_id"]} if model.get("eos_token_id") is not None else {}
    return {**(own or {}), **eos}


def tokenizer_eos_token_id(checkpoint: Path) -> int | None:
    """The id of the tokenizer's eos token (None: no ``tokenizer.json`` or no eos token in it)."""
    directory = Path(checkpoint)
    tokenizer_file = directory / "tokenizer.json"
    # Older checkpoints name their special tokens only in special_tokens_map.json, which transformers reads too.
    eos = next((found for found in (token_text((read_json_object(directory / name) or {}).get("eos_token"))
                                    for name in ("tokenizer_config.json", "special_tokens_map.json"))
                if found is not None), None)
    if eos is None or not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer as RustTokenizer

    token_id = RustTokenizer.from_file(str(tokenizer_file)).token_to_id(eos)
    return None if token_id is None else int(token_id)


def eos_token_ids(checkpoint: Path) -> tuple[int, ...]:
    """Every token that ends a sequence of this checkpoint (see the module doc): the tokenizer's first."""
    raw = generation_config(checkpoint).get("eos_token_id")
    listed = [raw] if isinstance(raw, int) else list(raw or [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in listed):
        raise ValidationError(f"{Path(checkpoint) / 'generation_config.json'}: eos_token_id must be an integer "
                              f"or a list of them, got {raw!r}")
    ids: list[int] = []
    for token in [tokenizer_eos_token_id(checkpoint), *listed]:
        if token is not None and token not in ids:
            ids.append(token)
    return tuple(ids)


def sampling_defaults(checkpoint: Path) -> dict[str, float | int]:
    """The request defaults of the checkpoint's generation config (see the module doc), checked at start-up."""
    raw = generation_config(checkpoint)
    where = Path(checkpoint) / "generation_config.json"
    out: dict[str, float | int] = {k: raw[k] for k in SAMPLING_DEFAULT_KEYS if raw.get(k) is not None}
    if raw.get("max_new_tokens") is not None:
        out["max_tokens"] = raw["max_new_tokens"]
    problems = [f"{where}: {k} must be a number, got {v!r}" for k, v in out.items()
                if isinstance(v, bool) or not isinstance(v, int | float)]
    problems += [f"{where}: {k} must be a finite number, got {v!r}" for k, v in out.items()
                 if isinstance(v, float) and not math.isfinite(v)]  # Python's json reads Infinity and NaN
    problems += [f"{where}: {k} must be an integer, got {out[k]!r}" for k in INTEGER_KEYS
                 if isinstance(out.get(k), float) and math.isfinite(out[k]) and out[k] != int(out[k])]
    if problems:
        raise ValidationError(problems)
    out.update({k: int(out[k]) for k in INTEGER_KEYS if k in out})
    try:
        SamplingParams(max_tokens=int(out.get("max_tokens", 1)), temperature=float(out.get("temperature", 1.0)),
                       top_p=float(out.get("top_p", 1.0)), top_k=int(out.get("top_k", 0)),
                       min_p=float(out.get("min_p", 0.0)), repetition_penalty=float(out.get("repetition_penalty", 1.0)),
                       presence_penalty=float(out.get("presence_penalty", 0.0)),
                       frequency_penalty=float(out.get("frequency_penalty", 0.0)))
    except ValidationError as exc:
        raise ValidationError([f"{where}: {p}" for p in exc.problems]) from exc
    return out


__all__ = ["eos_token_ids", "generation_config", "read_json_object", "sampling_defaults", "tokenizer_eos_token_id"]
