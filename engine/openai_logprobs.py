"""Generated tokens' log-probabilities in the OpenAI API's two shapes.

The core reports, per generated token of a request that asked, the token's
log-probability and the ``k`` most likely alternatives, from the model's own
logits (before penalties and temperature, vLLM's default).  Here they get
their text (each token decoded alone, special tokens as themselves, as vLLM
does; one that ends in part of a character split over byte tokens completed with
the tokens before it, :func:`token_text`) and the offset of the token in the generated text (a stop token that
ended the request is listed too, as in vLLM, though its text is not shown),
and are written as a completion's ``logprobs``
(``tokens``, ``token_logprobs``, ``top_logprobs`` with the chosen token among
them, ``text_offset``) or a chat choice's (``content``: ``token``,
``logprob``, ``bytes``, ``top_logprobs``).

A completion with ``echo`` and ``logprobs`` also gets its prompt's tokens
first (the core computes them, vLLM's ``prompt_logprobs``): the first prompt
token has ``null`` for its log-probability and alternatives, as in OpenAI's
and vLLM's answers, since nothing predicts it; the offsets of the prompt's
tokens add up their texts' lengths, special tokens included, as vLLM's do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.sampling import TokenLogprob
from engine.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One generated token: its text, log-probability, the top alternatives, and where its text begins."""

    token: str
    logprob: float | None
    """None only for a prompt's first token."""
    top: tuple[tuple[str, float], ...] | None
    text_offset: int


MAX_CONTEXT = 4
"""Tokens before one that may hold the rest of its character: a UTF-8 character is at most 4 bytes (vLLM's)."""


def token_text(tokenizer: Tokenizer, token_id: int, context: Sequence[int] = ()) -> str:
    """The token's text alone; one that ends in part of a character (U+FFFD) is completed with ``context``.

    ``context`` is the tokens sampled before it, oldest first.  As vLLM's ``_correct_decoded_token``: the token
    decoded after its last 1..4 context tokens, less the text of the context tokens that are whole on their own;
    ``""`` while the character is still incomplete (a later token's text shows it).
    """
    text = tokenizer.decode_token(token_id)
    if not text.endswith("\ufffd"):
        return text
    context = list(context[-MAX_CONTEXT:])
    for size in range(1, len(context) + 1):
        before = context[-size:]
        decoded = tokenizer.decode([*before, token_id])
        if decoded.endswith("\ufffd"):
            continue
        clean = len(before)  # the context tokens before the ones that are part of this character
        while clean > 0 and tokenizer.decode_token(before[clean - 1]).endswith("\ufffd"):
            clean -= 1
        prefix = tokenizer.decode(before[:clean]) if clean else ""
        # A decoder that normalizes (strips a first space) may not start ``decoded`` with ``prefix``.
        return decoded[len(os.path.commonprefix([prefix, decoded])):]  # noqa: RUF071 (strings, by character)
    return ""


def logprob_entry(tokenizer: Tokenizer, token_id: int, logprobs: TokenLogprob, text_offset: int,
                  context: Sequence[int] = ()) -> LogprobEntry:
    """The entry of a token sampled after ``context`` (the tokens sampled before it; its alternatives too)."""
    chosen, top = logprobs
    return LogprobEntry(token=token_text(tokenizer, token_id, context), logprob=chosen,
                        top=tuple((token_text(tokenizer, t, context), value) for t, value in top),
                        text_offset=text_offset)


def prompt_entries(tokenizer: Tokenizer, prompt: list[int], logprobs: tuple[TokenLogprob, ...]) -> list[LogprobEntry]:
    """The prompt's entries (tokens 1.. from ``logprobs``).

    A token's offset is the sum of the lengths of the tokens' texts before it, as vLLM counts them: in the
    echoed text, special tokens included.  A scored token's text is completed with the scored tokens before it
    (not the first, as vLLM's context leaves it out).
    """
    entries: list[LogprobEntry] = []
    offset = 0
    for i, token_id in enumerate(prompt):
        if i == 0 or i > len(logprobs):
            entry = LogprobEntry(tokenizer.decode_token(token_id), None, None, offset)
        else:
            entry = logprob_entry(tokenizer, token_id, logprobs[i - 1], offset, prompt[max(1, i - MAX_CONTEXT):i])
        entries.append(entry)
        offset += len(entry.token)
    return entries


def completion_logprobs(entries: list[LogprobEntry] | None) -> dict[str, Any] | None:
    """A completion choice's ``logprobs`` (None: not asked for)."""
    if entries is None:
        return None
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        # OpenAI's legacy completions list the chosen token among the most likely ones.
        "top_logprobs": [None if e.top is None else {**dict(e.top), e.token: e.logprob} for e in entries],
        "text_offset": [e.text_offset for e in entries],
    }


def chat_logprobs(entries: list[LogprobEntry] | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs`` (None: not asked for)."""
    if entries is None:
        return None
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode("utf-8")),
         "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in e.top or ()]}
        for e in entries
    ]}


__all__ = ["MAX_CONTEXT", "LogprobEntry", "chat_logprobs", "completion_logprobs", "logprob_entry", "prompt_entries",
           "token_text"]
