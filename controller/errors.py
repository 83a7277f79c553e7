"""Errors only the controller raises; the shared hierarchy is :mod:`contracts.errors`::

    contracts.errors.MoesloError
    └── ActuationError         an actuator failed after its retries (502)

and :func:`malformed_answer`, which makes a dependency's answer of the wrong shape that dependency's
:class:`~contracts.errors.UnavailableError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from contracts.errors import MoesloError, UnavailableError


class ActuationError(MoesloError):
    """An actuator failed to carry out a decision after its retries."""


@contextmanager
def malformed_answer(source: str) -> Iterator[None]:
    """An answer of the wrong shape (valid JSON, not the document asked for) is ``source`` unavailable: a fault of
    that engine or that Prometheus, never of the controller's tick."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise UnavailableError(f"{source}: malformed answer ({type(exc).__name__}: {exc})") from exc
