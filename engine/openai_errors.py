"""The engine's error document, in OpenAI's shape, and the one mapping from errors to HTTP status.

Every route answers a failure with::

    {"error": {"message": ..., "type": ..., "param": ..., "code": <HTTP status>}}

``type`` is OpenAI's (``invalid_request_error`` for anything the client can
fix, 404s included; ``rate_limit_error``, ``service_unavailable_error``,
``server_error``), ``param`` names the request field at fault when one is
(else ``null``), and ``code`` is the HTTP status, as vLLM sends it.  moeslo's
own detail rides along: ``problems`` (every validation failure) and
``retry_after_s`` (429).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from fastapi.responses import Response

from contracts.errors import (
    INVALID_REQUEST,
    MoesloError,
    NotFoundError,
    OverloadedError,
    UnavailableError,
    ValidationError,
    http_status,
    openai_error_type,
)
from engine.errors import PromptTooLongError

UNAVAILABLE_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503: about what a supervisor needs to notice the failed probe and restart the replica."""

_PARAM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)(?::| must | token ids | has )")
"""A problem that starts ``field:``, ``field.0.sub:`` or ``field must ...`` names its field."""


def status_for(exc: MoesloError) -> int:
    """The engine's HTTP status for ``exc`` (:data:`contracts.errors.OPENAI_STATUS`)."""
    return http_status(exc)


error_type = openai_error_type


def error_param(exc: MoesloError) -> str | None:
    """The request field at fault: the first problem's ``field:`` prefix; for an over-long prompt, its field."""
    if isinstance(exc, NotFoundError) and exc.kind == "model":
        return "model"
    if not isinstance(exc, ValidationError):
        return None
    if isinstance(exc, PromptTooLongError):
        return exc.param
    for problem in exc.problems:
        match = _PARAM.match(problem)
        if match is not None:
            return _field_path(match.group(1))
    return None


def _field_path(loc: str) -> str:
    """``messages.0.role`` as is; a union's type tag dropped (``prompt.str`` is ``prompt``)."""
    kept: list[str] = []
    for part in loc.split("."):
        if kept and not part.isdigit() and not kept[-1].isdigit():
            break
        kept.append(part)
    return ".".join(kept)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none"})
"""pydantic's tags of a union's plain members, which read as identifiers (``prompt.str``)."""
_KEY = re.compile(r"-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*")


def loc_path(loc: Iterable[int | str]) -> str:
    """pydantic's ``loc`` as a field path: field names, indexes and token-id keys; a union member's type tag
    (``constrained-str``, ``list[int]``, ``str``), which names no field, dropped (``stop.list[constrained-str].0``
    is ``stop.0``)."""
    return ".".join(str(part) for part in loc
                    if isinstance(part, int) or (_KEY.fullmatch(part) and part not in _TYPE_TAGS))


def error_body(exc: MoesloError) -> dict[str, Any]:
    """The inside of the error document (``{"error": error_body(exc)}``)."""
    status = status_for(exc)
    body: dict[str, Any] = {"message": str(exc), "type": error_type(status), "param": error_param(exc),
                            "code": status}
    if isinstance(exc, ValidationError):
        body["problems"] = list(exc.problems)
    if isinstance(exc, OverloadedError):
        body["retry_after_s"] = exc.retry_after_s
    return body


def error_response(exc: MoesloError) -> Response:
    """The error document of ``exc`` with its status (and ``Retry-After`` on 429 and 503)."""
    headers = {}
    if isinstance(exc, OverloadedError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, UnavailableError):
        headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
    return error_document(error_body(exc), status_for(exc), headers)


def http_error_body(status: int, message: str) -> dict[str, Any]:
    """The error document's inside for an HTTP-level failure (unknown route, wrong method)."""
    return {"message": message, "type": error_type(status), "param": None, "code": status}


def error_document(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    # ensure_ascii: a lone surrogate echoed in a message (a field name) must not break the encoding.
    return Response(json.dumps({"error": body}), status_code=status, headers=headers or {},
                    media_type="application/json")


__all__ = [
    "INVALID_REQUEST",
    "UNAVAILABLE_RETRY_AFTER_S",
    "error_body",
    "error_document",
    "error_param",
    "error_response",
    "error_type",
    "http_error_body",
    "loc_path",
    "status_for",
]
