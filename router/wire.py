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
