"""Errors only the engine raises; the shared hierarchy is :mod:`contracts.errors`::

    contracts.errors.ValidationError
    └── PromptTooLongError     prompt longer than the context (400)
    contracts.errors.MoesloError
    └── RequestFailedError     the engine failed this one request; the others go on (500)
"""

from __future__ import annotations

from contracts.errors import MoesloError, ValidationError


class PromptTooLongError(ValidationError):
    """A prompt that does not fit the model's context.

    Without ``max_tokens`` (the API cuts it to the context the prompt leaves) only the prompt's length is at
    fault, and the message says so as vLLM's does; with it (a caller that does not cut it), the sum is.
    ``context_note`` says why the context is shorter than the model's, when the server's KV cache set it.
    """

    def __init__(self, *, prompt_tokens: int, max_model_len: int, max_tokens: int | None = None,
                 param: str = "prompt", context_note: str | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.param = param  # the request field the prompt came from: ``prompt``, or a chat's ``messages``
        self.context_note = context_note
        why = "" if context_note is None else f" ({context_note})"
        if max_tokens is None:
            message = (f"This model's maximum context length is {max_model_len} tokens{why}. However, your prompt "
                       f"contains {prompt_tokens} input tokens, which leaves no room for an output token (a prompt "
                       f"may have at most {max_model_len - 1} tokens). Please reduce the length of the input prompt.")
        else:
            context = "the model's context" if context_note is None else "the served context"
            message = (f"prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
                       f"but {context} is {max_model_len} tokens "
                       f"(prompt_tokens + max_tokens must be <= {max_model_len})")
            message += "" if context_note is None else f": {context_note}"
        super().__init__(message)


class RequestFailedError(MoesloError):
    """The engine could not complete one request (its sampler failed); the others go on (500)."""
