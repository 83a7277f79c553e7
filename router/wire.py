"""How the proxy path writes to its client: ASGI-shaped messages through one ``send`` callable.

``http.response.start`` (status, headers), then ``http.response.body``
messages (``more_body`` while more follows).  A ``send`` whose client has
left raises :class:`ClientGone`: aiohttp's own write error is also an
upstream-client error class, and a client leaving must never eject a replica.  The server adapter
(:class:`router.app.ResponseWriter`) turns them into aiohttp writes; tests
may collect them in a list.  Plus the header filters: the client's request headers sent upstream,
and a replica's answer headers relayed back.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]


class ClientGone(Exception):  # noqa: N818 (an event, not an error of ours: the client left)
    """Raised by a ``send`` whose client has gone away (kept apart from the upstream client's errors)."""


Send = Callable[[Message], Awaitable[None]]

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
})  # fmt: skip
"""The connection's own headers (RFC 9110 7.6.1), with those the Connection header names and every ``Proxy-*``."""
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"}
"""Not sent upstream (``accept-encoding`` too, so answers come uncompressed and relay byte for byte; ``expect``:
the router has the whole body before it sends, and a forwarded ``100-continue`` made the upstream client wait for
a 100 Continue that a replica need not send)."""
_NOT_RELAYED = _HOP_BY_HOP | {b"content-length", b"date", b"server"}
"""Not relayed to the client: the router writes its own length (or chunks a stream), Date and Server."""
_JSON = [(b"content-type", b"application/json")]


def _end_to_end(headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """``headers`` (names lowercased) less ``dropped``, ``Proxy-*`` and those the Connection header names."""
    pairs = [(k.lower(), v) for k, v in headers]
    named = {token.strip().lower() for k, v in pairs if k == b"connection" for token in v.split(b",")}
    return [(k, v) for k, v in pairs if k not in dropped and k not in named and not k.startswith(b"proxy-")]


def upstream_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones (as the text pairs the upstream client takes)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in _end_to_end(headers, _NOT_FORWARDED)]


def relayed_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A replica's answer headers as the router relays them: all but the connection's own and those it rewrites."""
    return _end_to_end(headers, _NOT_RELAYED)


async def send_json(send: Send, status: int, body: object,
                    headers: Iterable[tuple[bytes, bytes]] = ()) -> None:  # fmt: skip
    await send_bytes(send, status, json.dumps(body).encode(), [*_JSON, *headers])


async def send_bytes(send: Send, status: int, content: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """A whole response (with its Content-Length, so the server need not chunk it)."""
    head = [*headers, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": content, "more_body": False})


__all__ = ["ClientGone", "Message", "Send", "relayed_headers", "send_bytes", "send_json", "upstream_headers"]


class StreamErrors:
    """Watches a relayed SSE stream for an ``error`` event: an engine (ours, vLLM) that fails a request after its
    headers says so in the stream, under status 200, and ends it with ``[DONE]``; the router counts it by the error's
    ``code``, as it would the same answer as a status."""

    MAX_EVENT_BYTES = 1 << 16
    """An event longer than this is not an error document: it is passed over, not buffered."""

    def __init__(self) -> None:
        self.code: int | None = None
        """The first error event's ``code`` (500 where it has none)."""
        self._partial = b""

    def outcome(self, status: int) -> str:
        """The relayed stream's outcome: the replica's error, as a status or an error event, is ``upstream_status``."""
        return "ok" if status < 400 and self.code is None else "upstream_status"

    def scan(self, chunk: bytes) -> None:
        *events, self._partial = (self._partial + chunk).split(b"\n\n")
        if len(self._partial) > self.MAX_EVENT_BYTES:
            self._partial = b""
        for event in events:
            if self.code is None and event.startswith(b"data: {") and b'"error"' in event:
                self.code = _error_code(event[len(b"data: "):])


def _error_code(document: bytes) -> int | None:
    try:
        body = json.loads(document)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    return code if isinstance(code, int) and 100 <= code < 600 else 500
