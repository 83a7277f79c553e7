"""The router's HTTP server (aiohttp): the OpenAI routes proxied, plus its own ``/health``, ``/metrics`` and state.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (routed
by the policy; a replica without chat answers its own 404, relayed),
``GET /v1/models`` (from the first healthy replica that answers), ``GET /health`` (200 while a
replica is healthy), ``GET /metrics`` (the ``moeslo_router_*`` series) and
``GET /router/replicas`` (each replica's state as the policies see it).
With a controller (``RouterConfig.controller_url``) the replica set follows
the controller's list (:mod:`router.membership`).
Every error leaves as the project's error document (:mod:`router.errors`).

aiohttp rather than an ASGI server: its C HTTP parser keeps the router's
cost per request well under uvicorn + h11's on the same core.  The server
must run with ``handler_cancellation=True`` (:func:`run`, and the tests'
runner do), so a client that goes away cancels its request's path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from contracts.errors import MoesloError, NotFoundError, UnavailableError
from router.config import RouterConfig
from router.errors import UpstreamError, UpstreamTimeoutError, error_body, error_document
from router.forward import UPSTREAM_FAILURES, Router
from router.membership import Membership
from router.monitor import Monitor
from router.wire import ClientGone, Message, relayed_headers, upstream_headers

_log = logging.getLogger(__name__)
ROUTER: web.AppKey[Router] = web.AppKey("router", Router)
MONITOR: web.AppKey[Monitor | None] = web.AppKey("monitor", object)  # type: ignore[arg-type]
MEMBERSHIP: web.AppKey[Membership | None] = web.AppKey("membership", object)  # type: ignore[arg-type]


class ResponseWriter:
    """The proxy path's ``send`` over an aiohttp response (Content-Length when the body comes whole).

    A start without ``content-length`` is a stream's: its status and headers go out at once, so the client
    knows its request began while the replica prefills; a whole answer's wait for its body (its length).
    """

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self._start: Message | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._start = message
            if all(k.lower() != b"content-length" for k, _ in message["headers"]):
                await self._prepare(streamed=True)
            return
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self.response is None:
            await self._prepare(streamed=more, length=len(body))
        assert self.response is not None
        try:
            if body:
                await self.response.write(body)
            if not more:
                await self.response.write_eof()
        except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError too
            raise ClientGone(str(exc)) from None

    async def _prepare(self, *, streamed: bool, length: int = 0) -> None:
        """Send the status line and headers: a stream's chunked (closed at its end for HTTP/1.0), else ``length``."""
        assert self._start is not None, "body before start"
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._start["headers"]
                   if k.lower() != b"content-length"]  # fmt: skip
        self.response = web.StreamResponse(status=self._start["status"], headers=headers)
        if streamed and self.request.version >= (1, 1):
            self.response.enable_chunked_encoding()
        elif streamed:  # HTTP/1.0 has no chunks: the body ends where the connection closes, as vLLM's does
            self.response.force_close()
        else:
            self.response.content_length = length
        try:
            await self.response.prepare(self.request)
        except ConnectionResetError as exc:
            raise ClientGone(str(exc)) from None


def _json(status: int, body: object, headers: list[tuple[bytes, bytes]] | None = None) -> web.Response:
    extra = {k.decode(): v.decode() for k, v in headers or []}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json", headers=extra)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:  # fmt: skip
    try:
        return await handler(request)
    except MoesloError as exc:
        return _json(*error_document(exc))
    except web.HTTPMethodNotAllowed as exc:  # a real route, another method: 405 with Allow, as the engine answers
        allow = ", ".join(sorted(exc.allowed_methods))
        detail = f"Method Not Allowed: {request.method} {request.path} (allowed: {allow})"
        return _json(405, {"error": error_body(detail, 405)}, [(b"Allow", allow.encode())])
    except web.HTTPNotFound:
        return _json(*error_document(NotFoundError("route", f"{request.method} {request.path}")))
    except web.HTTPException as exc:  # aiohttp's own refusals (a body over client_max_size: 413)
        return _json(exc.status, {"error": error_body(exc.reason, exc.status)})
    except Exception as exc:  # a bug of ours: logged, and still the error document, never a dropped connection
        _log.exception("unexpected error on %s %s", request.method, request.path)
        return _json(500, {"error": error_body(f"router error: {type(exc).__name__}", 500)})


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    writer = ResponseWriter(request)
    await request.app[ROUTER].completion(request.path_qs, request.raw_headers, body, writer.send)
    if writer.response is None:  # nothing was written (cannot happen short of a bug): say so, do not hang
        raise UnavailableError("the router wrote no answer")
    return writer.response


class _Listing(NamedTuple):
    """A replica's answer to ``GET /v1/models`` (or ``POST /tokenize``): its document (200), or its refusal of the
    client (a 4xx)."""

    replica: str
    status: int
    content: bytes
    headers: list[tuple[bytes, bytes]]

    def relayed(self) -> web.Response:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers]
        return web.Response(status=self.status, body=self.content, headers=headers)


async def _models(request: web.Request) -> web.StreamResponse:
    """The model list of the first healthy replica that answers (refusing ones are ejected)."""
    listing = await _model_list(request.app[ROUTER], request)
    if listing.status != 200:
        return listing.relayed()
    return web.Response(body=listing.content, content_type="application/json")


async def _model(request: web.Request) -> web.StreamResponse:
    """One model of that list (OpenAI's retrieve), or a 404 naming it."""
    wanted = request.match_info["model"]
    listing = await _model_list(request.app[ROUTER], request)
    if listing.status != 200:
        return listing.relayed()
    try:
        listed = json.loads(listing.content)["data"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UpstreamError(f"replica {listing.replica}'s /v1/models is not a model list: {exc}",
                            replica=listing.replica) from exc  # fmt: skip
    for model in listed if isinstance(listed, list) else []:
        if isinstance(model, dict) and model.get("id") == wanted:
            return _json(200, model)
    raise NotFoundError("model", wanted)


async def _model_list(router: Router, request: web.Request) -> _Listing:
    """The /v1/models answer of the first healthy replica that answers with a model list."""
    return await _first_answer(router, request, "/v1/models")


async def _tokenizer(request: web.Request) -> web.StreamResponse:
    """``POST /tokenize`` and ``/detokenize`` (vLLM's): any replica's tokenizer is the model's, so the first
    healthy one that answers does; its answer, refusal included, is relayed unchanged."""
    answer = await _first_answer(request.app[ROUTER], request, request.path, body=await request.read())
    return answer.relayed()


async def _first_answer(router: Router, request: web.Request, path: str, *, body: bytes | None = None) -> _Listing:
    """The answer to ``path`` (GET, or POST of ``body``) of the first healthy replica that answers it, asked with
    the client's headers (a replica started with an API key guards these routes as it does completions).

    A replica's JSON 4xx (its refusal of the client's key, say) is the client's to read: relayed unchanged. A
    replica that refuses the connection is ejected; one that answers another error is passed over for the next,
    as is one that answers a GET nothing within the scrape timeout; when none answers, the last one's failure is
    the error.  A POST (tokenizing a long document takes a while) has the upstream timeout, and one that ran out
    is not sent again: that replica did the work, and another would do it twice.
    """
    headers = upstream_headers(request.raw_headers)
    method, limit_s = ("GET", router.config.scrape_timeout_s) if body is None else \
        ("POST", router.config.upstream_timeout_s)  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=limit_s, sock_connect=router.config.connect_timeout_s)
    failure: UpstreamError | None = None
    for name in [n for n in router.pool.names if router.pool.is_healthy(n)]:
        try:
            async with router.session.request(method, name + path, headers=headers, data=body,
                                              timeout=timeout) as answer:  # fmt: skip
                listing = _Listing(name, answer.status, await answer.read(), relayed_headers(answer.raw_headers))
                is_json = "json" in answer.headers.get("content-type", "")
        except TimeoutError:
            failure = UpstreamTimeoutError(f"replica {name} did not answer {path} within {limit_s:g} s",
                                           replica=name)  # fmt: skip
            if body is not None:
                raise failure from None
            continue
        except UPSTREAM_FAILURES:
            router.eject(name)
            continue
        if is_json and (listing.status == 200 or 400 <= listing.status < 500):
            return listing
        failure = UpstreamError(f"replica {name} answered {path} with HTTP {listing.status}", replica=name)
    raise failure or UnavailableError("no healthy replica")


async def _health(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER]
    pool = router.pool
    live = sum(pool.is_healthy(n) for n in pool.names)
    if live:
        return _json(200, {"status": "ok", "healthy_replicas": live})
    if router.config.admission == "queue":
        # Queue mode takes requests with no replica (a fleet at zero): it holds them, and that queue is
        # what the controller scales up on, so the router must stay in its Service.
        return _json(200, {"status": "queueing: no healthy replica", "healthy_replicas": 0})
    return _json(503, {"status": "no healthy replica", "healthy_replicas": 0})


async def _metrics(request: web.Request) -> web.StreamResponse:
    content = generate_latest(request.app[ROUTER].metrics.registry)
    return web.Response(body=content, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _replicas(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER]
    states = [dataclasses.asdict(s) for s in router.pool.snapshot()]
    return _json(200, {"policy": router.config.policy, "replicas": states})


async def _startup(app: web.Application) -> None:
    membership = app[MEMBERSHIP]
    if membership is not None:
        await membership.refresh()  # serve with the controller's replicas from the first request
        membership.start()
    monitor = app[MONITOR]
    if monitor is not None:
        monitor.start()


async def _cleanup(app: web.Application) -> None:
    membership = app[MEMBERSHIP]
    if membership is not None:
        await membership.stop()
    monitor = app[MONITOR]
    if monitor is not None:
        await monitor.stop()
    await app[ROUTER].aclose()


def create_app(config: RouterConfig, *, registry: CollectorRegistry | None = None,
               monitor: bool = True) -> web.Application:  # fmt: skip
    """The router app for ``config`` (its replica monitor, and with a controller its membership, start and stop
    with the app)."""
    router = Router(config, registry=registry)
    app = web.Application(middlewares=[_errors], client_max_size=64 << 20)
    app[ROUTER] = router
    app[MONITOR] = Monitor(router) if monitor else None
    app[MEMBERSHIP] = Membership(router) if monitor and config.controller_url is not None else None
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)  # ids may hold a slash: Qwen/Qwen3-30B-A3B
    app.router.add_post("/tokenize", _tokenizer)
    app.router.add_post("/detokenize", _tokenizer)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/router/replicas", _replicas)
    app.on_startup.append(_startup)
    app.on_cleanup.append(_cleanup)
    return app


def run(app: web.Application, *, host: str, port: int, **options: Any) -> None:
    """Serve until interrupted, cancelling a request's path when its client goes away."""
    web.run_app(app, host=host, port=port, handler_cancellation=True, print=None, **options)


__all__ = ["MEMBERSHIP", "MONITOR", "ROUTER", "ResponseWriter", "create_app", "run"]
