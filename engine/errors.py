"""The one error hierarchy of moeslo.

Every error the project raises on purpose derives from :class:`MoesloError`
and carries structured fields.  HTTP status codes are mapped from these
classes in one place (``controller.api.errors`` and ``engine.server``), so
no handler invents its own::

    MoesloError
    ├── ValidationError        bad input; ``problems`` lists every failure (400/422)
    │   ├── PlacementError     an expert placement that cannot be applied
    │   └── PromptTooLongError prompt longer than the context (400)
    ├── NotFoundError          a named resource does not exist (404)
    ├── ConflictError          a write raced another one (409 / 412)
    ├── OverloadedError        queue full; ``retry_after_s`` says when to retry (429)
    ├── UnavailableError       a dependency (Prometheus, an engine) is down (503)
    ├── ActuationError         an actuator failed after its retries
    └── DataError              an input file is malformed; names the line
"""

from __future__ import annotations

from collections.abc import Sequence


class MoesloError(Exception):
    """Root of every error moeslo raises on purpose."""


class ValidationError(MoesloError):
    """Input that fails validation; ``problems`` gathers every failure."""

    def __init__(self, problems: Sequence[str] | str) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


class PlacementError(ValidationError):
    """An expert placement that cannot be applied; the old one stays in force."""


class PromptTooLongError(ValidationError):
    """A prompt that does not fit the model's context."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
            f"but the model's context is {max_model_len} tokens "
            f"(prompt_tokens + max_tokens must be <= {max_model_len})"
        )


class NotFoundError(MoesloError):
    """A named resource does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} not found")


class ConflictError(MoesloError):
    """A write lost a race (stale ETag, resourceVersion conflict, name taken)."""


class OverloadedError(MoesloError):
    """The engine's waiting queue is full."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class UnavailableError(MoesloError):
    """A dependency is down or answered with an error."""


class ActuationError(MoesloError):
    """An actuator failed to carry out a decision after its retries."""


class DataError(MoesloError):
    """An input file is malformed; the message names the file and line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
