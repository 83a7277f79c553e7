"""``--port 0``: the server's socket is bound before the server starts, so the command can say (and export) the
port the system picked; uvicorn and aiohttp bind port 0 themselves without saying which port they got."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable
from typing import Any

from cli.common import ADDRESS_ERRORS, check_bindable
from contracts.errors import ValidationError

STARTUP_FAILURE = 3
"""The exit status ``uvicorn.run`` gives a server that did not start."""
DRAIN_FLUSH_S = 2.0
"""How long a shutdown waits, after its drain timeout's hook ended the requests in flight, for their error
answers to be written before uvicorn cancels what is left."""


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


def run_uvicorn(app: Any, *, host: str, port: int, listener: socket.socket | None,
                on_drain_timeout: Callable[[], None] | None = None, **settings: Any) -> None:
    """``uvicorn.run``, on ``listener`` when one is bound already (as ``uvicorn.run`` does for its workers).

    With ``on_drain_timeout``, a shutdown's ``timeout_graceful_shutdown`` runs it (in a thread) when it ends, and
    uvicorn waits :data:`DRAIN_FLUSH_S` more before it cancels what is left: the hook ends the requests still in
    flight (the engine aborts them), so their clients get an error, where uvicorn's cancel cut a stream with no
    error event and answered a whole request with a plain-text 500."""
    import uvicorn

    drain_s = settings.get("timeout_graceful_shutdown")
    if on_drain_timeout is not None and drain_s is not None:
        settings["timeout_graceful_shutdown"] = drain_s + DRAIN_FLUSH_S
    config = uvicorn.Config(app, host=host, port=listening_port(listener, port), **settings)
    server = (uvicorn.Server(config) if on_drain_timeout is None or drain_s is None
              else _draining_server(config, on_drain_timeout, drain_s))  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn.run's: the server re-raises the Ctrl-C it handled
        server.run(sockets=None if listener is None else [listener])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _draining_server(config: Any, on_drain_timeout: Callable[[], None], drain_s: float) -> Any:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(drain_s, lambda: loop.run_in_executor(None, on_drain_timeout))
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return DrainingServer(config)
