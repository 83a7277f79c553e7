"""An ASGI layer both HTTP servers share: an unexpected error answered without dropping the connection."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class UnexpectedErrors:
    """An unexpected exception before the response started: logged with its traceback, answered with
    ``answer()`` (the server's own error document, a 500), and not raised on, so the client's keep-alive
    connection stays open.

    FastAPI's ``exception_handler(Exception)`` runs in Starlette's outermost middleware, which raises the
    exception on after answering; uvicorn then drops the connection (without ``Connection: close``), and the
    client's next request on it was reset.
    """

    def __init__(self, app: ASGIApp, answer: Callable[[], ASGIApp]) -> None:
        self.app = app
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            if started:
                raise
            log.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            await self.answer()(scope, receive, send)
