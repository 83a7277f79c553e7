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
    settings: ControllerSettings = request.app.state.settings
    if settings.api_token is None:
        return
    if credentials is None:
        raise UnauthorizedError("writes need an Authorization: Bearer <token> header")
    expected = settings.api_token.get_secret_value().encode()
    if not secrets.compare_digest(credentials.credentials.encode(), expected):
        raise UnauthorizedError("the bearer token is not valid for this controller")


WriteAccess = Annotated[None, Depends(require_write_access)]
