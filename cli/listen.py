"""``--port 0``: the server's socket is bound before the server starts, so the command can say (and export) the
port the system picked; uvicorn and aiohttp bind port 0 themselves without saying which port they got."""

from __future__ import annotations

import contextlib
import socket
import sys
from typing import Any

from cli.common import ADDRESS_ERRORS, check_bindable
from contracts.errors import ValidationError

STARTUP_FAILURE = 3
"""The exit status ``uvicorn.run`` gives a server that did not start."""


def listener_for(host: str, port: int) -> socket.socket | None:
    """Before anything slow starts: for port 0, a socket bound now to a port the system picks on the first
    address ``host`` names (one address: on several, each would get a port of its own); for any other port,
    None once :func:`cli.common.check_bindable` finds it free (the server binds it on every address ``host``
    names)."""
    if port != 0:
        check_bindable(host, port)
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ValidationError(f"cannot listen on {host}:0: {exc.strerror}") from exc
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        listener.close()
        if exc.errno in ADDRESS_ERRORS:
            raise ValidationError(f"cannot listen on {address[0]}:0: {exc.strerror}") from exc
        raise
    return listener


def listening_port(listener: socket.socket | None, port: int) -> int:
    """The port the server listens on: the bound socket's, else the one asked for."""
    return port if listener is None else int(listener.getsockname()[1])


def run_uvicorn(app: Any, *, host: str, port: int, listener: socket.socket | None, **settings: Any) -> None:
    """``uvicorn.run``, on ``listener`` when one is bound already (as ``uvicorn.run`` does for its workers)."""
    import uvicorn

    if listener is None:
        uvicorn.run(app, host=host, port=port, **settings)
        return
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=listening_port(listener, port), **settings))
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn.run's: the server re-raises the Ctrl-C it handled
        server.run(sockets=[listener])
    if not server.started:
        sys.exit(STARTUP_FAILURE)
