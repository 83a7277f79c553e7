"""Generated tokens' log-probabilities in the OpenAI API's two shapes.

The core reports, per generated token of a request that asked, the token's
log-probability and the ``k`` most likely alternatives, from the model's own
logits (before penalties and temperature, vLLM's default).  Here they get
their text (each token decoded alone, special tokens as themselves, as vLLM
does) and the offset of the token in the generated text (a stop token that
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


def logprob_entry(tokenizer: Tokenizer, token_id: int, logprobs: TokenLogprob, text_offset: int) -> LogprobEntry:
    chosen, top = logprobs
    return LogprobEntry(token=tokenizer.decode_token(token_id), logprob=chosen,
                        top=tuple((tokenizer.decode_token(t), value) for t, value in top), text_offset=text_offset)


def prompt_entries(tokenizer: Tokenizer, prompt: list[int], logprobs: tuple[TokenLogprob, ...]) -> list[LogprobEntry]:
    """The prompt's entries (tokens 1.. from ``logprobs``).

    A token's offset is the sum of the lengths of the tokens' texts before it, as vLLM counts them: in the
    echoed text, special tokens included.
    """
    entries: list[LogprobEntry] = []
    offset = 0
    for i, token_id in enumerate(prompt):
        if i == 0 or i > len(logprobs):
            entry = LogprobEntry(tokenizer.decode_token(token_id), None, None, offset)
        else:
            entry = logprob_entry(tokenizer, token_id, logprobs[i - 1], offset)
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


__all__ = ["LogprobEntry", "chat_logprobs", "completion_logprobs", "logprob_entry", "prompt_entries"]
