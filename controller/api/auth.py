"""Bearer-token access for writes; reads stay open."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controller.api.errors import UnauthorizedError
from controller.config import ControllerSettings

_bearer = HTTPBearer(auto_error=False, description="The controller's api_token (writes only)")


def require_write_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Writes need ``Authorization: Bearer <api_token>`` when a token is configured."""
    _check_token(request.app.state.settings, None if credentials is None else credentials.credentials)


def check_write_access(request: Request) -> None:
    """:func:`require_write_access` outside a route: FastAPI parses a JSON body before any dependency runs,
    so a body that does not parse is judged here first (a client without the token learns nothing of it)."""
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
