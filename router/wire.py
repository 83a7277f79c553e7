"""How the proxy path writes to its client: ASGI-shaped messages through one ``send`` callable.

``http.response.start`` (status, headers), then ``http.response.body``
messages (``more_body`` while more follows).  A ``send`` whose client has
left raises :class:`ClientGone`: aiohttp's own write error is also an
upstream-client error class, and a client leaving must never eject a replica.  The server adapter
(:class:`router.app.ResponseWriter`) turns them into aiohttp writes; tests
may collect them in a list.  Plus the header filter for upstream requests.
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
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"proxy-authorization", b"proxy-authenticate", b"accept-encoding",
})  # fmt: skip
"""Not forwarded upstream (``accept-encoding`` too, so answers come uncompressed and relay byte for byte)."""
_JSON = [(b"content-type", b"application/json")]


def upstream_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones (as the text pairs the upstream client takes)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k.lower() not in _HOP_BY_HOP]


async def send_json(send: Send, status: int, body: object,
                    headers: Iterable[tuple[bytes, bytes]] = ()) -> None:  # fmt: skip
    await send_bytes(send, status, json.dumps(body).encode(), [*_JSON, *headers])


async def send_bytes(send: Send, status: int, content: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """A whole response (with its Content-Length, so the server need not chunk it)."""
    head = [*headers, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": content, "more_body": False})


__all__ = ["ClientGone", "Message", "Send", "send_bytes", "send_json", "upstream_headers"]
