"""Errors only the engine raises; the shared hierarchy is :mod:`contracts.errors`::

    contracts.errors.ValidationError
    └── PromptTooLongError     prompt longer than the context (400)
    contracts.errors.MoesloError
    └── RequestFailedError     the engine failed this one request; the others go on (500)
"""

from __future__ import annotations

from contracts.errors import MoesloError, ValidationError


class PromptTooLongError(ValidationError):
    """A prompt that does not fit the model's context."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int, max_model_len: int, param: str = "prompt") -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.param = param  # the request field the prompt came from: ``prompt``, or a chat's ``messages``
        super().__init__(
            f"prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
            f"but the model's context is {max_model_len} tokens "
            f"(prompt_tokens + max_tokens must be <= {max_model_len})"
        )


class RequestFailedError(MoesloError):
    """The engine could not complete one request (its sampler failed); the others go on (500)."""
