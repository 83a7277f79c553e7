"""A checkpoint's generation settings, read as vLLM reads them: which tokens end a sequence.

A sequence ends at the tokenizer's eos token (``tokenizer_config.json``'s
``eos_token``, looked up in ``tokenizer.json``) and at every id of
``generation_config.json``'s ``eos_token_id`` (an id or a list of them;
``config.json``'s when the checkpoint has no ``generation_config.json``, as
transformers falls back), unless a request sets ``ignore_eos``.  This is what
vLLM does (``SamplingParams.update_from_generation_config``), and what
transformers' ``generate`` does for the generation config's ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.errors import ValidationError
from engine.chat_template import token_text


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
    if own is not None:
        return own
    model = read_json_object(directory / "config.json") or {}
    return {"eos_token_id": model["eos_token_id"]} if model.get("eos_token_id") is not None else {}


def tokenizer_eos_token_id(checkpoint: Path) -> int | None:
    """The id of the tokenizer's eos token (None: no ``tokenizer.json`` or no eos token in it)."""
    directory = Path(checkpoint)
    tokenizer_file = directory / "tokenizer.json"
    eos = token_text((read_json_object(directory / "tokenizer_config.json") or {}).get("eos_token"))
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


__all__ = ["eos_token_ids", "generation_config", "read_json_object", "tokenizer_eos_token_id"]
