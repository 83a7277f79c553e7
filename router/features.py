"""A request body's routing features (pure): prompt length, output asked for, streaming, prefix blocks.

The router does not tokenize: a token-id prompt's length is exact, a text
prompt's is estimated at four characters a token.  Shapes it does not
recognise count as empty prompts; validating requests is the engine's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if _is_token_ids(prompt):
        assert isinstance(prompt, list)
        return RequestFeatures(prompt_tokens=len(prompt), max_tokens=max_tokens, stream=stream,
                               block_tokens=block_tokens,
                               prefix_blocks=token_blocks(prompt, block_tokens=block_tokens, max_blocks=max_blocks))
    if isinstance(prompt, str):
        return RequestFeatures(prompt_tokens=-(-len(prompt) // CHARS_PER_TOKEN), max_tokens=max_tokens, stream=stream,
                               block_tokens=block_tokens,
                               prefix_blocks=text_blocks(prompt, block_tokens=block_tokens, max_blocks=max_blocks))
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                or all(_is_token_ids(p) for p in prompt)):  # fmt: skip
        return _batch_features(prompt, body.get("n"), max_tokens=max_tokens, stream=stream,
                               block_tokens=block_tokens, max_blocks=max_blocks)  # fmt: skip
    return RequestFeatures(prompt_tokens=0, max_tokens=max_tokens, stream=stream)


def _batch_features(prompts: list[Any], n: object, *, max_tokens: int, stream: bool, block_tokens: int,
                    max_blocks: int) -> RequestFeatures:  # fmt: skip
    """A list of prompts: the engine prefills each one ``n`` times (a choice each), so all count; the prefix
    blocks are the first prompt's."""
    copies = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    first = prompts[0]
    if isinstance(first, str):
        tokens = sum(-(-len(p) // CHARS_PER_TOKEN) for p in prompts)
        blocks = text_blocks(first, block_tokens=block_tokens, max_blocks=max_blocks)
    else:
        tokens = sum(len(p) for p in prompts)
        blocks = token_blocks(first, block_tokens=block_tokens, max_blocks=max_blocks)
    return RequestFeatures(prompt_tokens=tokens * copies, max_tokens=max_tokens, stream=stream,
                           block_tokens=block_tokens, prefix_blocks=blocks)  # fmt: skip


__all__ = ["request_features"]
