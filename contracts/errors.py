"""The one error hierarchy of moeslo (its shared part).

Every error the project raises on purpose derives from :class:`MoesloError`
and carries structured fields.  HTTP status codes are mapped from these
classes by one function over a table per dialect (:func:`http_status`): the
OpenAI dialect of the engine and the router (:data:`OPENAI_STATUS`: bad input
is 400, as OpenAI's API answers; the router puts its upstream errors in front)
and the controller's REST API (``controller.api.errors``: its own classes
first, bad input 422, as FastAPI answers), so no handler invents its own.  Errors only one package
raises live in that package and subclass these (``engine.errors``,
``controller.errors``)::

    MoesloError
    ├── ValidationError        bad input; ``problems`` lists every failure (400/422)
    │   ├── PlacementError     an expert placement that cannot be applied
    │   └── (engine.errors.PromptTooLongError)
    ├── NotFoundError          a named resource does not exist (404)
    ├── ConflictError          a write raced another one (409 / 412)
    ├── OverloadedError        queue full; ``retry_after_s`` says when to retry (429)
    ├── UnavailableError       a dependency (Prometheus, an engine) is down (503)
    ├── DataError              an input file is malformed; names the line
    └── (controller.errors.ActuationError)
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


class DataError(MoesloError):
    """An input file is malformed; the message names the file and line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


StatusTable = tuple[tuple[type[MoesloError], int], ...]
"""(class, HTTP status), most specific first: the first class the error is an instance of decides."""

OPENAI_STATUS: StatusTable = (
    (PlacementError, 422),
    (ValidationError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (OverloadedError, 429),
    (UnavailableError, 503),
    (MoesloError, 500),
)
"""The engine's and the router's statuses (the router puts its upstream errors in front)."""


def http_status(exc: MoesloError, table: StatusTable = OPENAI_STATUS) -> int:
    """The HTTP status of ``exc`` under ``table`` (500 for a class the table does not name)."""
    return next((status for cls, status in table if isinstance(exc, cls)), 500)


INVALID_REQUEST = "invalid_request_error"


def openai_error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status, as the engine and the router both write it."""
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable_error"
    if 400 <= status < 500:
        return INVALID_REQUEST
    return "server_error"


__all__ = [
    "INVALID_REQUEST",
    "OPENAI_STATUS",
    "ConflictError",
    "DataError",
    "MoesloError",
    "NotFoundError",
    "OverloadedError",
    "PlacementError",
    "StatusTable",
    "UnavailableError",
    "ValidationError",
    "http_status",
    "openai_error_type",
]
