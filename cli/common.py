"""Shared pieces of the command line: the console, JSON output, the error exit."""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from contracts.errors import MoesloError, ValidationError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
"""The log levels ``--log-level`` takes (Python's logging's)."""
UVICORN_LOG_LEVELS = (*LOG_LEVELS, "trace")
"""uvicorn's: Python's and ``trace``."""


def positive(value: float | None) -> float | None:
    """An option's callback: a finite number above zero (a duration, a rate, a scale; typer's ``min`` admits the
    bound, and ``inf`` and ``nan``)."""
    if value is not None and not 0 < value < math.inf:
        raise typer.BadParameter(f"must be above 0 and finite, got {value}")
    return value


def at_least(
    low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
) -> Callable[[float | None], float | None]:
    """An option's callback: a finite number from ``low`` to ``high``, either end left out when it is open
    (typer's ``min`` takes ``inf`` and ``nan`` past it: ``nan`` compares false with every bound)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        above = low < value if low_open else low <= value
        below = value < high if high_open else value <= high
        if above and below and math.isfinite(value):
            return value
        if low_open or high_open:
            ends = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise typer.BadParameter(f"must be a number in {ends}, got {value}")
        upper = "" if high == math.inf else f" and at most {high:g}"
        raise typer.BadParameter(f"must be a finite number of {low:g} or more{upper}, got {value}")

    return check


def nonempty(value: str | None) -> str | None:
    """An option's callback: a path given as text must not be empty (typer would read ``\"\"`` as the current
    directory and write there).  Path options are typed ``str`` for it (as ``Path`` they arrive as ``.``)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty")
    return value


def ttft_allowances_option(value: str) -> str:
    """An option's callback: long-prompt allowances as ``REFERENCE:PER_1K,...`` (checked, returned as given)."""
    from contracts.ttft_objective import exported_allowances

    try:
        exported_allowances(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def log_level(value: str) -> str:
    """An option's callback: one of :data:`LOG_LEVELS`, in any case."""
    return _one_of(value, LOG_LEVELS)


def uvicorn_log_level(value: str) -> str:
    """An option's callback: one of :data:`UVICORN_LOG_LEVELS`, in any case."""
    return _one_of(value, UVICORN_LOG_LEVELS)


def _one_of(value: str, levels: tuple[str, ...]) -> str:
    if value.lower() not in levels:
        raise typer.BadParameter(f"must be one of {', '.join(levels)}, got {value!r}")
    return value.lower()

console = Console(stderr=True, emoji=False)
"""Human-readable progress and messages go to stderr, so stdout stays parseable; ``:fire:`` in a path
or a message stays as written (rich would draw an emoji)."""


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout; a NaN or infinite number is ``null`` (JSON has no word for them)."""
    text = json.dumps(_finite(payload), indent=2, sort_keys=False, default=_jsonable, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite (numpy's too) as None, in dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _jsonable(value: Any) -> Any:
    tolist: Callable[[], Any] | None = getattr(value, "tolist", None)
    if tolist is not None:
        return _finite(tolist())
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dim(text: str) -> None:
    """A progress line on the console (the benchmarks' and the stack's progress callback)."""
    console.print(f"[dim]{escape(text)}[/]")


def print_error(message: object) -> None:
    """``error: <message>`` on the console, the message as written (brackets in it are not markup), on one line
    however long: rich would wrap it at 80 columns when stderr is not a terminal."""
    console.print(f"[bold red]error:[/] {escape(str(message))}", soft_wrap=True)


def check_bindable(host: str, port: int) -> None:
    """Refuse, before anything slow starts, an address the server could not listen on: a port in use or
    not ours, an unknown host (a server that loads a model first would otherwise say it serves, then fail).

    Every address the host resolves to is tried as asyncio's ``create_server`` binds (uvicorn's and
    aiohttp's): ``""`` is every interface, IPv6 sockets are IPv6-only.  Any other failure is left to
    the server itself, so the check never refuses what it would accept.
    """
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValidationError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno in ADDRESS_ERRORS:
                    raise ValidationError(f"cannot listen on {address[0]}:{port}: {exc.strerror}") from exc
                return


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
"""What a path the user gave can be: missing, taken by a file or a folder, not ours to write."""
_FILE_SYSTEM_ERRNOS = frozenset({errno.EROFS, errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.ELOOP,
                                 errno.EFBIG})  # fmt: skip
"""What the file system a path leads to can refuse: read-only, a name too long, full, a link loop."""


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn what bad input raises into a one-line message and exit status 2, never a traceback.

    Our own errors (:class:`MoesloError`, an address that cannot be listened on among them), a path
    that is missing or of the wrong kind, and a ``ValueError`` from parsing what was typed (a knob, a
    number, a list) and sizes too large for memory all end as ``error: ...``.  ``MOESLO_DEBUG=1``
    shows the traceback instead.
    """
    try:
        yield
    except MoesloError as exc:
        if os.environ.get("MOESLO_DEBUG"):
            raise
        print_error(exc)
        raise typer.Exit(code=2) from exc
    except OSError as exc:
        if os.environ.get("MOESLO_DEBUG") or not (isinstance(exc, _PATH_ERRORS) or exc.errno in _FILE_SYSTEM_ERRNOS):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print_error(f"{exc.strerror or exc}{where}")
        raise typer.Exit(code=2) from exc
    except ValueError as exc:
        if os.environ.get("MOESLO_DEBUG"):
            raise
        print_error(f"{exc} (MOESLO_DEBUG=1 shows where)")
        raise typer.Exit(code=2) from exc
    except MemoryError as exc:  # sizes no machine holds (numpy, or torch through engine.checkpoint, says how much)
        if os.environ.get("MOESLO_DEBUG"):
            raise
        print_error(f"not enough memory for the sizes asked for: {exc or 'out of memory'}")
        raise typer.Exit(code=2) from exc


ADDRESS_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})
"""Listening failures that are the user's choice of host or port, not a fault of ours."""
