"""The documents of an OpenAI response: a completion's or a chat's, whole or as stream chunks.

:class:`CompletionFormat` writes ``text_completion`` choices with ``text``;
:class:`ChatFormat` ``chat.completion`` choices with a ``message``, streamed as
``delta``s after one role chunk per choice.  Every document of a response
carries its one ``created``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from engine.engine_types import RequestOutput
from engine.openai_logprobs import LogprobEntry, chat_logprobs, completion_logprobs
from engine.stats import CHAT, TEXT_COMPLETION

StopReason = str | int | None
"""vLLM's ``stop_reason``: the stop string or the ``stop_token_ids`` id (or generation_config's eos id beside the
tokenizer's) that ended a choice (None: anything else, the tokenizer's eos included)."""


class Piece(NamedTuple):
    """What one output of a choice shows: its text, the output, and its tokens' logprobs (None: not asked)."""

    text: str
    out: RequestOutput
    logprobs: list[LogprobEntry] | None
    stop_reason: StopReason = None


class ChoiceResult(NamedTuple):
    """A choice, whole or as one chunk shows it."""

    text: str
    finish_reason: str | None
    stop_reason: StopReason
    logprobs: list[LogprobEntry] | None

    @classmethod
    def of(cls, piece: Piece) -> ChoiceResult:
        return cls(piece.text, piece.out.finish_reason, piece.stop_reason, piece.logprobs)


class ResponseFormat(Protocol):
    """The documents of one kind of response (completion or chat)."""

    @property
    def operation(self) -> str:
        """Its GenAI operation name (``text_completion``, ``chat``)."""
        ...

    def opening(self, request_id: str, choices: int) -> list[dict[str, Any]]:
        """Chunks sent before the first token's (chat: the assistant's role, per choice)."""
        ...

    def chunk(self, request_id: str, index: int, piece: Piece) -> dict[str, Any]: ...

    def whole(self, request_id: str, choices: list[ChoiceResult]) -> dict[str, Any]: ...

    def usage_chunk(self, request_id: str, usage: dict[str, int]) -> dict[str, Any]:
        """The last chunk of a stream that asked for usage: no choices."""
        ...


def _now_s() -> int:
    return int(time.time())


@dataclass(frozen=True)
class CompletionFormat:
    operation: ClassVar[str] = TEXT_COMPLETION
    model_name: str
    created: int = dataclasses.field(default_factory=_now_s)
    """The response's ``created``: one value for the whole response, every chunk of a stream included."""

    def opening(self, request_id: str, choices: int) -> list[dict[str, Any]]:
        return []

    def chunk(self, request_id: str, index: int, piece: Piece) -> dict[str, Any]:
        choice = _text_choice(index, ChoiceResult.of(piece))
        return _document(request_id, "text_completion", self.model_name, self.created, [choice])

    def whole(self, request_id: str, choices: list[ChoiceResult]) -> dict[str, Any]:
        return _document(request_id, "text_completion", self.model_name, self.created,
                         [_text_choice(i, choice) for i, choice in enumerate(choices)])

    def usage_chunk(self, request_id: str, usage: dict[str, int]) -> dict[str, Any]:
        return {**_document(request_id, "text_completion", self.model_name, self.created, []), "usage": usage}


def _text_choice(index: int, choice: ChoiceResult) -> dict[str, Any]:
    return {"index": index, "text": choice.text, "logprobs": completion_logprobs(choice.logprobs),
            "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}


@dataclass(frozen=True)
class ChatFormat:
    operation: ClassVar[str] = CHAT
    model_name: str
    created: int = dataclasses.field(default_factory=_now_s)

    def opening(self, request_id: str, choices: int) -> list[dict[str, Any]]:
        return [_document(request_id, "chat.completion.chunk", self.model_name, self.created, [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]) for i in range(choices)]

    def chunk(self, request_id: str, index: int, piece: Piece) -> dict[str, Any]:
        reason = piece.out.finish_reason
        delta = {"content": piece.text} if piece.text or reason is None else {}
        return _document(request_id, "chat.completion.chunk", self.model_name, self.created, [
            {"index": index, "delta": delta, "logprobs": chat_logprobs(piece.logprobs), "finish_reason": reason,
             "stop_reason": piece.stop_reason}
        ])

    def whole(self, request_id: str, choices: list[ChoiceResult]) -> dict[str, Any]:
        return _document(request_id, "chat.completion", self.model_name, self.created, [
            {"index": i, "message": {"role": "assistant", "content": choice.text},
             "logprobs": chat_logprobs(choice.logprobs), "finish_reason": choice.finish_reason,
             "stop_reason": choice.stop_reason}
            for i, choice in enumerate(choices)
        ])

    def usage_chunk(self, request_id: str, usage: dict[str, int]) -> dict[str, Any]:
        return {**_document(request_id, "chat.completion.chunk", self.model_name, self.created, []), "usage": usage}


def _document(request_id: str, kind: str, model_name: str, created: int, choices: list[dict[str, Any]]
              ) -> dict[str, Any]:  # fmt: skip
    return {"id": response_id(request_id, chat=kind.startswith("chat.")), "object": kind, "created": created,
            "model": model_name, "choices": choices}


def response_id(request_id: str, *, chat: bool) -> str:
    """The response's id from its first choice's: OpenAI's and vLLM's chat ids read chatcmpl-, completions' cmpl-."""
    return "chat" + request_id if chat and request_id.startswith("cmpl-") else request_id


__all__ = ["ChatFormat", "ChoiceResult", "CompletionFormat", "Piece", "ResponseFormat", "StopReason", "response_id"]
