"""The router's errors and their one mapping to HTTP status codes and the project's error document.

::

    MoesloError (contracts.errors)
    ├── ValidationError      a body that is not a JSON object (400)
    ├── NotFoundError        a route the router does not serve (404)
    ├── OverloadedError      every replica predicted over the TTFT objective (429 + Retry-After)
    └── UnavailableError     no healthy replica (503)
        ├── UpstreamError    a replica answered garbage or broke the connection (502)
        └── UpstreamTimeoutError  a replica did not answer in time (504)

The document is OpenAI's, as the engine writes it: ``{"error": {"message",
"type", "param", "code", ...}}``, ``type`` OpenAI's for the status
(``invalid_request_error``, ``rate_limit_error``, ``service_unavailable_error``,
``server_error``), the same word the engine writes.  ``param`` names the request parameter at
fault (``model`` for a model the replicas do not serve) and is ``null``
otherwise: the router judges a body only as a whole.  moeslo's own detail
rides along (``problems`` for validation, ``retry_after_s`` for overload,
``replica`` for an upstream failure), so a client sees one shape whoever
refused it.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from contracts.errors import (
    OPENAI_STATUS,
    MoesloError,
    NotFoundError,
    OverloadedError,
    StatusTable,
    UnavailableError,
    ValidationError,
    http_status,
    openai_error_type,
)

UNAVAILABLE_RETRY_AFTER_S = 1
"""Retry-After of a 503 (no healthy replica); the engine's own 503 says 5."""


class UpstreamError(UnavailableError):
    """A replica's answer could not be relayed (connection broken, not the HTTP or JSON it claimed)."""

    def __init__(self, message: str, *, replica: str) -> None:
        self.replica = replica
        super().__init__(message)


class UpstreamTimeoutError(UpstreamError):
    """A replica did not answer within the upstream timeout."""


ROUTER_STATUS: StatusTable = ((UpstreamTimeoutError, 504), (UpstreamError, 502), *OPENAI_STATUS)
"""The router's statuses: a replica that did not answer in time 504, one whose answer broke 502."""


def status_for(exc: MoesloError) -> int:
    """The router's HTTP status for ``exc`` (:data:`ROUTER_STATUS`)."""
    return http_status(exc, ROUTER_STATUS)


def error_param(exc: MoesloError) -> str | None:
    """OpenAI's ``param``: the request parameter at fault, or None when no one parameter is."""
    if isinstance(exc, NotFoundError) and exc.kind == "model":
        return "model"
    return None


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """The inside of the error document (``{"error": error_body(...)}``): OpenAI's four fields, ``type``
    as the engine writes it for the status."""
    return {"message": message, "type": openai_error_type(status), "param": param, "code": status}


def error_document(exc: MoesloError) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
    """(status, body, extra headers) of the error response for ``exc``."""
    status = status_for(exc)
    body = error_body(str(exc), status, error_param(exc))
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(exc, ValidationError):
        body["problems"] = list(exc.problems)
    if isinstance(exc, OverloadedError):
        body["retry_after_s"] = exc.retry_after_s
        headers.append((b"retry-after", str(max(1, math.ceil(exc.retry_after_s))).encode()))
    if isinstance(exc, UpstreamError):
        body["replica"] = exc.replica
    elif isinstance(exc, UnavailableError):  # no healthy replica: ejected ones are checked every scrape interval
        headers.append((b"retry-after", str(UNAVAILABLE_RETRY_AFTER_S).encode()))
    return status, {"error": body}, headers


def sse_error_event(exc: MoesloError) -> bytes:
    """The error as the last events of a stream already under way (the engine's shape, then ``[DONE]``)."""
    _, body, _ = error_document(exc)
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def upstream_error(exc: BaseException, name: str) -> UpstreamError:
    """The error for a replica ``name`` that broke the connection, or was silent past a timeout (``exc``)."""
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeoutError(f"replica {name} did not answer in time ({type(exc).__name__})", replica=name)
    return UpstreamError(f"replica {name} broke the connection ({type(exc).__name__}: {exc})", replica=name)


__all__ = [
    "ROUTER_STATUS",
    "UNAVAILABLE_RETRY_AFTER_S",
    "UpstreamError",
    "UpstreamTimeoutError",
    "error_body",
    "error_document",
    "error_param",
    "sse_error_event",
    "status_for",
    "upstream_error",
]
