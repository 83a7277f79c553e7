"""A request body's routing features (pure): prompt length, output asked for, streaming, prefix blocks.

The router does not tokenize: a token-id prompt's length is exact, a text
prompt's is estimated at four characters a token.  Shapes it does not
recognise count as empty prompts; validating requests is the engine's job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from contracts.errors import ValidationError
from router.prefix import CHARS_PER_TOKEN, text_blocks, token_blocks
from router.types import RequestFeatures


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _chat_text(messages: object) -> str:
    """A chat request's messages as one text (``role: content`` lines); text parts of list contents only."""
    if not isinstance(messages, list):
        return ""
    lines = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        lines.append(f"{message.get('role', '')}: {content if isinstance(content, str) else ''}\n")
    return "".join(lines)


def request_features(body: Mapping[str, Any], *, chat: bool = False, block_tokens: int = 16,
                     max_blocks: int = 8) -> RequestFeatures:  # fmt: skip
    """Features of a completions (``prompt``) or chat (``messages``) request body."""
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        max_tokens = 16
    stream = body.get("stream") is True
    prompt: object = _chat_text(body.get("messages")) if chat else body.get("prompt")
    prompts = _prompt_list(prompt)
    if prompts is None:
        return RequestFeatures(prompt_tokens=0, max_tokens=max_tokens, stream=stream)
    n = body.get("n")
    first = prompts[0]
    if isinstance(first, str):
        tokens = sum(-(-len(p) // CHARS_PER_TOKEN) for p in prompts)
        blocks = text_blocks(first, block_tokens=block_tokens, max_blocks=max_blocks)
    else:
        tokens = sum(len(p) for p in prompts)
        blocks = token_blocks(first, block_tokens=block_tokens, max_blocks=max_blocks)
    return RequestFeatures(prompt_tokens=tokens, prompts=len(prompts),
                           choices=n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1,
                           max_tokens=max_tokens, stream=stream, block_tokens=block_tokens,
                           prefix_blocks=blocks)  # fmt: skip


def body_features(body: bytes, path: str, *, block_tokens: int = 16, max_blocks: int = 8) -> RequestFeatures:
    """Features of a raw request body sent to ``path`` (chat when it ends in ``/chat/completions``); a
    ValidationError when it is not a JSON object (the router answers 400)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"body: not JSON ({exc})") from exc
    except RecursionError as exc:
        raise ValidationError("body: JSON nested too deeply") from exc
    if not isinstance(payload, dict):
        raise ValidationError("body: must be a JSON object")
    chat = path.partition("?")[0].endswith("/chat/completions")
    return request_features(payload, chat=chat, block_tokens=block_tokens, max_blocks=max_blocks)


def _prompt_list(prompt: object) -> list[Any] | None:
    """The request's prompts (the engine runs each as requests of its own; the prefix is the first one's):
    one text or token-id list, or a list of either; None for a shape the engine refuses."""
    if isinstance(prompt, str) or (_is_token_ids(prompt) and prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                or all(_is_token_ids(p) for p in prompt)):  # fmt: skip
        return prompt
    return None


__all__ = ["body_features", "request_features"]
