"""vLLM's ``/tokenize`` and ``/detokenize`` requests: a prompt's or a chat's token ids, and token ids' text.

``/tokenize`` takes a ``prompt`` (a text) or ``messages`` (rendered with the
chat template, as ``/v1/chat/completions`` renders them, with its
``add_generation_prompt`` and ``chat_template_kwargs``) and answers
``{"count", "max_model_len", "tokens"}``; ``add_special_tokens`` adds what the
tokenizer puts around a text (vLLM's defaults: true for a prompt, false for
messages).  ``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``, special
tokens as themselves.  Both may name the ``model``.  vLLM's other fields
(``return_token_strs``, ``tools``, ...) are refused by name, as elsewhere.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from contracts.errors import ValidationError
from engine.openai_chat import ChatCompletionRequest, ChatMessage
from engine.protocol import CompletionRequest

CHAT_ONLY = ("add_generation_prompt", "chat_template_kwargs")
"""Fields that shape a chat's rendering, refused with a ``prompt``."""


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def special_tokens(self) -> bool:
        """Whether to add the tokenizer's special tokens (left out: vLLM's default for the kind of request)."""
        return self.messages is None if self.add_special_tokens is None else self.add_special_tokens

    def as_chat(self) -> ChatCompletionRequest | None:
        """The chat request whose prompt this one asks for (None: a ``prompt``)."""
        if self.messages is None:
            return None
        return ChatCompletionRequest(messages=self.messages, add_generation_prompt=self.add_generation_prompt,
                                     chat_template_kwargs=self.chat_template_kwargs)

    def check(self) -> None:
        """Refuse what the model's types allow but this route cannot serve (every problem at once)."""
        if (self.prompt is None) == (self.messages is None):
            raise ValidationError("prompt: send a prompt (a text) or messages, one of them")
        chat = self.as_chat()
        if chat is not None:
            problems = chat.problems()
        else:
            problems = CompletionRequest(prompt=self.prompt or "").problems()
            problems += [f"{name}: only with messages" for name in CHAT_ONLY if name in self.model_fields_set]
        if problems:
            raise ValidationError(problems)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[StrictInt]

    def check(self, vocab_size: int) -> None:
        """Token ids outside the vocabulary are a 400 (before the tokenizer overflows on them)."""
        bad = [t for t in self.tokens if not 0 <= t < vocab_size]
        if bad:
            raise ValidationError(f"tokens: must be token ids in [0, {vocab_size}); got {bad[:5]}")


__all__ = ["DetokenizeRequest", "TokenizeRequest"]
