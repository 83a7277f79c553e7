"""ASGI plumbing the router needs without a framework: reading a body, writing JSON, filtering headers.

The proxy speaks raw ASGI (no routing framework in the hot path); these are
its few helpers.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from contracts.errors import ValidationError

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_HOP_BY_HOP = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"proxy-authorization", b"proxy-authenticate", b"accept-encoding",
})  # fmt: skip
"""Not forwarded upstream (``accept-encoding`` too, so answers come uncompressed and relay byte for byte)."""
_JSON = [(b"content-type", b"application/json")]


async def read_body(receive: Receive, *, limit_bytes: int = 64 << 20) -> bytes:
    """The request body; a body over ``limit_bytes`` is a ValidationError."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise ValidationError(f"body: larger than {limit_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def upstream_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones."""
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]


async def send_json(send: Send, status: int, body: object,
                    headers: Iterable[tuple[bytes, bytes]] = ()) -> None:  # fmt: skip
    await send_bytes(send, status, json.dumps(body).encode(), [*_JSON, *headers])


async def send_bytes(send: Send, status: int, content: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})
    await send({"type": "http.response.body", "body": content, "more_body": False})


__all__ = ["Message", "Receive", "Send", "read_body", "send_bytes", "send_json", "upstream_headers"]
