"""Errors only the controller raises; the shared hierarchy is :mod:`contracts.errors`::

    contracts.errors.MoesloError
    ├── ActuationError         an actuator failed after its retries (502)
    │   └── LeadershipLostError     the lease was lost before an actuator's next change: it made none
    └── UnavailableError
        ├── EngineRefusalError      an engine's own HTTP error answer, its status kept (503)
        └── CommitUnconfirmedError  an engine took a placement to commit later, not yet done (503)

and :func:`malformed_answer`, which makes a dependency's answer of the wrong shape that dependency's
:class:`~contracts.errors.UnavailableError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from contracts.errors import MoesloError, UnavailableError


class ActuationError(MoesloError):
    """An actuator failed to carry out a decision after its retries."""


class LeadershipLostError(ActuationError):
    """The lease was lost before the actuator's next change, which it did not make: another replica acts now."""


class EngineRefusalError(UnavailableError):
    """An engine answered with an HTTP error (``status``): unavailable for this call, but the engine spoke."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def understood(self) -> bool:
        """A 4xx other than 404: the engine knew the route and refused the request (its kind is confirmed)."""
        return 400 <= self.status < 500 and self.status != 404


@contextmanager
def malformed_answer(source: str) -> Iterator[None]:
    """An answer of the wrong shape (valid JSON, not the document asked for) is ``source`` unavailable: a fault of
    that engine or that Prometheus, never of the controller's tick."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise UnavailableError(f"{source}: malformed answer ({type(exc).__name__}: {exc})") from exc


class CommitUnconfirmedError(UnavailableError):
    """An engine took a placement to commit in the background (vLLM's async EPLB) and had not committed it when
    the wait ended: it may still do so, so the placement is pending, not failed (``swap``: what it answered)."""

    def __init__(self, message: str, *, swap: dict[str, object]) -> None:
        super().__init__(message)
        self.swap = swap
