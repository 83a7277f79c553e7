"""Shared pieces of the command line: the console, JSON output, the error exit."""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from contracts.errors import MoesloError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
"""The log levels ``--log-level`` takes (those of Python's logging and of uvicorn)."""


def positive(value: float | None) -> float | None:
    """An option's callback: a number above zero (a duration, a rate, a scale; typer's ``min`` admits the bound)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be above 0, got {value}")
    return value


def log_level(value: str) -> str:
    """An option's callback: one of :data:`LOG_LEVELS`, in any case."""
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()

console = Console(stderr=True)
"""Human-readable progress and messages go to stderr, so stdout stays parseable."""


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    tolist: Callable[[], Any] | None = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dim(text: str) -> None:
    """A progress line on the console (the benchmarks' and the stack's progress callback)."""
    console.print(f"[dim]{escape(text)}[/]")


def print_error(message: object) -> None:
    """``error: <message>`` on the console, the message as written (brackets in it are not markup)."""
    console.print(f"[bold red]error:[/] {escape(str(message))}")


def check_bindable(host: str, port: int) -> None:
    """Raise the ``OSError`` listening on ``host:port`` would (a port in use, an unknown host) before anything
    slow starts: a server that loads a model first would otherwise say it serves, then fail."""
    if port == 0:
        return
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and aiohttp bind
        probe.bind((host, port))


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
"""What a path the user gave can be: missing, taken by a file or a folder, not ours to write."""


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn what bad input raises into a one-line message and exit status 2, never a traceback.

    Our own errors (:class:`MoesloError`), a path that is missing or of the wrong kind, an address
    already in use, and a ``ValueError`` from parsing what was typed (a knob, a number, a list) all
    end as ``error: ...``.  ``MOESLO_DEBUG=1`` shows the traceback of the last two instead.
    """
    try:
        yield
    except MoesloError as exc:
        print_error(exc)
        raise typer.Exit(code=2) from exc
    except _PATH_ERRORS as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print_error(f"{exc.strerror or exc}{where}")
        raise typer.Exit(code=2) from exc
    except (OSError, ValueError) as exc:
        unexpected = (isinstance(exc, OSError) and not isinstance(exc, socket.gaierror)
                      and exc.errno not in _ADDRESS_ERRORS)  # fmt: skip
        if os.environ.get("MOESLO_DEBUG") or unexpected:
            raise
        print_error(exc)
        raise typer.Exit(code=2) from exc


_ADDRESS_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})
"""Listening failures that are the user's choice of host or port, not a fault of ours."""
