"""The router as an ASGI app: the OpenAI routes proxied, plus its own ``/health``, ``/metrics`` and state.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (routed
by the policy; a replica without chat answers its own 404, relayed),
``GET /v1/models`` (from any healthy replica), ``GET /health`` (200 while a
replica is healthy), ``GET /metrics`` (the ``moeslo_router_*`` series) and
``GET /router/replicas`` (each replica's state as the policies see it).
Raw ASGI, no routing framework: this is the hot path.  Every error leaves
as the project's error document (:mod:`router.errors`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.errors import MoesloError, NotFoundError, UnavailableError
from router.config import RouterConfig
from router.errors import UpstreamError, error_document
from router.forward import Router
from router.monitor import Monitor
from router.wire import Receive, Send, read_body, send_bytes, send_json

_COMPLETIONS = frozenset({"/v1/completions", "/v1/chat/completions"})


class RouterApp:
    def __init__(self, router: Router, monitor: Monitor | None = None) -> None:
        self.router = router
        self.monitor = monitor
        self._models_turn = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except MoesloError as exc:
            status, body, headers = error_document(exc)
            await send_json(send, status, body, headers)

    async def _dispatch(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in _COMPLETIONS and method == "POST":
            await self.router.completion(scope, receive, send)
        elif path == "/v1/models" and method == "GET":
            await self._models(send)
        elif path == "/health" and method == "GET":
            live = sum(self.router.pool.is_healthy(n) for n in self.router.pool.names)
            await send_json(send, 200 if live else 503, {"status": "ok" if live else "no healthy replica",
                                                         "healthy_replicas": live})  # fmt: skip
        elif path == "/metrics" and method == "GET":
            content = generate_latest(self.router.metrics.registry)
            await send_bytes(send, 200, content, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
        elif path == "/router/replicas" and method == "GET":
            states = [dataclasses.asdict(s) for s in self.router.pool.snapshot()]
            await send_json(send, 200, {"policy": self.router.config.policy, "replicas": states})
        else:
            await read_body(receive)
            raise NotFoundError("route", f"{method} {path}")

    async def _models(self, send: Send) -> None:
        """The model list of the first healthy replica that answers (refusing ones are ejected)."""
        pool = self.router.pool
        names = [n for n in pool.names if pool.is_healthy(n)]
        for offset in range(len(names)):
            name = names[(self._models_turn + offset) % len(names)]
            try:
                answer = await self.router.client.get(name + "/v1/models")
            except httpx.TransportError:
                self.router.eject(name)
                continue
            if answer.status_code != 200 or "json" not in answer.headers.get("content-type", ""):
                raise UpstreamError(f"replica {name} answered /v1/models with HTTP {answer.status_code}", replica=name)
            self._models_turn += 1
            await send_bytes(send, 200, answer.content, [(b"content-type", b"application/json")])
            return
        raise UnavailableError("no healthy replica")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.monitor is not None:
                    self.monitor.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.monitor is not None:
                    await self.monitor.stop()
                await self.router.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(config: RouterConfig, *, registry: Any = None, transport: httpx.AsyncBaseTransport | None = None,
               monitor: bool = True) -> RouterApp:  # fmt: skip
    """The router app for ``config`` (its replica monitor starts with the server's lifespan)."""
    router = Router(config, registry=registry, transport=transport)
    return RouterApp(router, Monitor(router, transport=transport) if monitor else None)


__all__ = ["RouterApp", "create_app"]
