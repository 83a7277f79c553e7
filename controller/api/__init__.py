"""The controller's REST API (FastAPI): policies, status, decisions, OpenSLO, health, metrics."""

from __future__ import annotations

from controller.api.app import create_app
from controller.api.errors import STATUS_BY_ERROR, PreconditionRequiredError, UnauthorizedError, status_for

__all__ = ["STATUS_BY_ERROR", "PreconditionRequiredError", "UnauthorizedError", "create_app", "status_for"]
