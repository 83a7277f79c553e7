"""The FastAPI application: policies, status, decisions, health and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.auth import WriteGate
from controller.api.errors import PROBLEM_MEDIA_TYPE, install_error_handlers
from controller.api.page import router as page_router
from controller.api.page.cache import SeriesCache
from controller.api.policy_routes import router as policy_router
from controller.api.replica_routes import router as replica_router
from controller.api.status import RuntimeView
from controller.api.status import router as status_router
from controller.config import ControllerSettings
from controller.store import Store

API_VERSION = "1"


def create_app(
    settings: ControllerSettings,
    store: Store,
    *,
    registry: CollectorRegistry | None = None,
    service: RuntimeView | None = None,
    lifespan_hooks: tuple[Callable[[], Any], Callable[[], Any]] | None = None,
    page_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The controller's REST API over ``store``; ``service`` (the tick loop) feeds /v1/status.

    ``lifespan_hooks`` is an (async start, async stop) pair run with the server,
    which is how the service's tick loop shares the server's event loop.
    ``page_transport`` carries the status page's calls to Prometheus and Alertmanager (tests mock it).
    """

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if lifespan_hooks is not None:
            await lifespan_hooks[0]()
        try:
            yield
        finally:
            if lifespan_hooks is not None:
                await lifespan_hooks[1]()

    app = FastAPI(
        title="moeslo controller",
        version=API_VERSION,
        description=(
            "SLO policies for MoE inference, their status and the controller's decisions. "
            "Reads are open; writes need the bearer token when one is configured."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.registry = registry if registry is not None else CollectorRegistry()
    app.state.service = service
    app.state.page_transport = page_transport
    app.state.page_series = SeriesCache()
    if service is not None:
        app.state.check_target = service.check_target
    app.add_middleware(WriteGate)  # inside UnexpectedErrors, which install_error_handlers adds
    install_error_handlers(app)
    app.include_router(policy_router)
    app.include_router(replica_router)
    app.include_router(status_router)
    app.include_router(page_router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(HeadAsGet)
    return app


class HeadAsGet:
    """HEAD answered as GET without its body (RFC 9110, 9.3.2), headers and all: FastAPI's routes answer GET
    only, and ``curl -I`` or a load balancer's HEAD check would get a 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with error bodies under their real media type (problem+json)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for code, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                body = content.get("application/json", {}).get("schema", {})
                if code.isdigit() and int(code) >= 400 and body.get("$ref", "").endswith("/Problem"):
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    app.openapi_schema = schema
    return schema
