"""Bearer-token access for writes; reads stay open.

:class:`WriteGate` judges a write by its headers before its body is read: a client without the token gets
its 401, and a body longer than :data:`MAX_BODY_BYTES` its 413, whatever the body holds and however long it
is.  FastAPI parses a JSON body before any dependency of the route runs, so a check there came only after a
stranger's 40 MiB had been read and parsed on the event loop the tick loop shares.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import MoesloError
from controller.api.errors import PayloadTooLargeError, UnauthorizedError, error_problem
from controller.config import ControllerSettings

MAX_BODY_BYTES = 4 * 1024 * 1024
"""The longest body a write may send: the largest valid policy (every list and string at its limit, URLs in
ASCII) is about 0.9 MB of JSON, and an OpenSLO import of some thousand SLO documents fits too."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_bearer = HTTPBearer(auto_error=False, description="The controller's api_token (writes only)")


def require_write_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Writes need ``Authorization: Bearer <api_token>`` when a token is configured (in the schema; the
    :class:`WriteGate` has judged it already)."""
    _check_token(request.app.state.settings, None if credentials is None else credentials.credentials)


def check_write_access(request: Request) -> None:
    """:func:`require_write_access` from the headers alone, before any route (and its body) is reached."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    _check_token(request.app.state.settings, token.strip() if scheme.lower() == "bearer" and token.strip() else None)


def _check_token(settings: ControllerSettings, token: str | None) -> None:
    if settings.api_token is None:
        return
    if token is None:
        raise UnauthorizedError("writes need an Authorization: Bearer <token> header")
    expected = settings.api_token.get_secret_value().encode()
    if not secrets.compare_digest(token.encode(), expected):
        raise UnauthorizedError("the bearer token is not valid for this controller")


WriteAccess = Annotated[None, Depends(require_write_access)]


class WriteGate:
    """A write some route serves: the token checked, then the body read whole up to :data:`MAX_BODY_BYTES`
    (413 at once when ``Content-Length`` says more) and handed on.  A path or method no route serves goes on
    unread, to its 404 or 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS or not _routed(scope):
            await self.app(scope, receive, send)
            return
        try:
            check_write_access(Request(scope))
            body = await _bounded_body(scope, receive)
        except MoesloError as exc:
            await error_problem(exc)(scope, receive, send)
            return
        await self.app(scope, _replaying(body, receive), send)


def _routed(scope: Scope) -> bool:
    return any(route.matches(scope)[0] == Match.FULL for route in scope["app"].router.routes)


async def _bounded_body(scope: Scope, receive: Receive) -> list[Message]:
    """The request's body messages, refused (:class:`PayloadTooLargeError`) once past the limit."""
    declared = Headers(scope=scope).get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise PayloadTooLargeError(f"body: {declared} bytes; a write may send at most {MAX_BODY_BYTES}")
    messages: list[Message] = []
    length = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":  # the client went away: the route sees it as it would have
            return messages
        length += len(message.get("body", b""))
        if length > MAX_BODY_BYTES:
            raise PayloadTooLargeError(f"body: more than {MAX_BODY_BYTES} bytes, the most a write may send")
        if not message.get("more_body", False):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives back what the gate read (then waits for a disconnect as before)."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
