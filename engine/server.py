"""The OpenAI-compatible HTTP API, in the API process, over an :class:`~engine.client.EngineCoreClient`.

Routes: ``POST /v1/completions`` (text or token-id prompts, streaming as
server-sent events or not), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (rendered by whatever ``metrics`` callable the caller wires
in: this module imports no exporter), and the controller's control routes
``GET/POST /v1/placement`` and ``GET /v1/expert-load``.

This process validates and tokenizes requests, detokenizes outputs and
writes SSE; the engine core (its own process) schedules and runs the model.
A request's path: validate (400 naming the field) -> tokenize -> check what
the API side knows (vocabulary, context) -> send to the core -> the first
event is either the core's refusal (400/429) or the first token -> stream
or collect.  Stop strings, logprobs and other per-token work of the OpenAI
API belong on this side, in :func:`_events` (the core's per-token output
carries what they need; a stop found here ends the request in the core with
``client.abort(request_id, "stop")``).

HTTP status codes are mapped from :mod:`engine.errors` in one place,
:func:`status_for`.  A client that disconnects has its request aborted in
the core, which frees its KV blocks, before the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from contracts.errors import (
    ConflictError,
    MoesloError,
    NotFoundError,
    OverloadedError,
    PlacementError,
    UnavailableError,
    ValidationError,
)
from contracts.placement import Placement
from engine.client import EngineCoreClient, RequestStream
from engine.engine_types import RequestOutput
from engine.errors import RequestFailedError
from engine.protocol import CompletionRequest, StopMatcher
from engine.tokenizer import Tokenizer

MetricsRenderer = Callable[[], tuple[bytes, str]]
"""Returns the ``/metrics`` body and its media type."""

UNAVAILABLE_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503: about what a supervisor needs to notice the failed probe and restart the replica."""

log = logging.getLogger("moeslo.engine_server")


def status_for(exc: MoesloError) -> int:
    """The one mapping from moeslo errors to HTTP status codes."""
    if isinstance(exc, PlacementError):
        return 422
    if isinstance(exc, ValidationError):
        return 400
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, OverloadedError):
        return 429
    if isinstance(exc, UnavailableError):
        return 503
    return 500


def error_response(exc: MoesloError) -> Response:
    """The one error document: ``{"error": {"message", "type", "code", ...}}``, ASCII-safe JSON."""
    status = status_for(exc)
    body: dict[str, Any] = {"message": str(exc), "type": type(exc).__name__, "code": status}
    if isinstance(exc, ValidationError):
        body["problems"] = list(exc.problems)
    headers = {}
    if isinstance(exc, OverloadedError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        body["retry_after_s"] = exc.retry_after_s
    if isinstance(exc, UnavailableError):
        headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
    return _error_document(body, status, headers)


def _error_document(body: dict[str, Any], status: int, headers: dict[str, str]) -> Response:
    # ensure_ascii: a lone surrogate echoed in a message (a field name) must not break the encoding.
    return Response(json.dumps({"error": body}), status_code=status, headers=headers, media_type="application/json")


def create_app(
    engine: EngineCoreClient,
    tokenizer: Tokenizer,
    *,
    model_name: str,
    metrics: MetricsRenderer | None = None,
    on_shutdown: Iterable[Callable[[], None]] = (),
) -> FastAPI:
    """The API app; it starts the engine core on startup (if not yet) and stops it (and ``on_shutdown``) on exit."""
    hooks = list(on_shutdown)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.start)
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)
            for hook in hooks:
                hook()

    app = FastAPI(title="moeslo engine", lifespan=lifespan)
    _install_error_handlers(app)
    _add_control_routes(app, engine, metrics)
    _add_openai_routes(app, engine, tokenizer, model_name)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure as the one error document (:func:`error_response`); details of the unexpected go to the log."""

    @app.exception_handler(MoesloError)
    async def _moeslo_error(_: Request, exc: MoesloError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> Response:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            if err.get("type") == "extra_forbidden":
                problems.append(f"{loc}: not supported by this engine")
            else:
                problems.append(f"{loc}: {err.get('msg', 'invalid')}")
        return error_response(ValidationError(problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        body = {"message": str(exc.detail), "type": "HTTPError", "code": exc.status_code}
        return _error_document(body, exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(MoesloError("internal error (details are in the server log)"))


def _add_control_routes(app: FastAPI, engine: EngineCoreClient, metrics: MetricsRenderer | None) -> None:
    """``/health``, ``/metrics``, ``/v1/placement`` (GET, POST) and ``/v1/expert-load``."""

    @app.get("/health")
    async def health() -> JSONResponse:
        reason = engine.health()
        if reason is not None:
            return JSONResponse({"status": reason}, status_code=503,
                                headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        if metrics is None:
            raise NotFoundError("route", "/metrics (exporters are off)")
        body, media_type = await asyncio.to_thread(metrics)
        return Response(body, media_type=media_type)

    @app.get("/v1/placement")
    async def get_placement() -> dict[str, Any]:
        return engine.placement.to_json()

    @app.post("/v1/placement")
    async def post_placement(request: Request) -> dict[str, Any]:
        try:
            raw = await request.json()
        except ValueError as exc:
            raise ValidationError(f"body must be JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise PlacementError("body must be a JSON object like GET /v1/placement returns")
        placement = Placement.from_json(raw)
        swap = await asyncio.to_thread(engine.request_placement, placement)
        return {"duration_s": swap.duration_s, "experts_moved": swap.experts_moved,
                "bytes_moved": swap.bytes_moved}

    @app.get("/v1/expert-load")
    async def expert_load() -> dict[str, Any]:
        return _expert_load_json(engine)


def _add_openai_routes(app: FastAPI, engine: EngineCoreClient, tokenizer: Tokenizer, model_name: str) -> None:
    """``/v1/models`` and ``/v1/completions`` (streamed as server-sent events, or whole)."""
    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "moeslo",
                "max_model_len": engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival_s = time.monotonic()
        if body.model is not None and body.model != model_name:
            raise NotFoundError("model", body.model)
        body.check()
        prompt_ids = tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        stream = engine.add_request(prompt_ids, body.sampling_params(), arrival_s=arrival_s)
        request_id = stream.request_id

        def end_early() -> None:
            if not stream.finished:
                engine.abort(request_id)

        def close() -> None:
            watcher.cancel()
            end_early()

        # From now until the request ends, a client that goes away aborts it in the core.
        watcher = asyncio.ensure_future(_until_disconnect(request))
        watcher.add_done_callback(lambda w: None if w.cancelled() else end_early())
        try:
            first = await stream.next()  # the core's refusal (400, 429) raises here, before any byte is sent
        except BaseException:
            watcher.cancel()
            end_early()
            raise
        texts = _texts(first, stream, tokenizer, body.stop_strings, lambda: engine.abort(request_id, "stop"))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _EngineStreamingResponse(
                _sse(texts, engine, request_id, model_name, include_usage),
                on_close=close,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
            )
        try:
            return await _collect(texts, engine, request_id, model_name, disconnected=watcher)
        finally:
            close()


class _EngineStreamingResponse(StreamingResponse):
    """A streamed completion that aborts its request in the core the moment the response ends early.

    Starlette cancels the stream when the client disconnects; the abort here
    does not wait for the generator to be finalized, so it reaches the core
    before its next step.
    """

    def __init__(self, content: AsyncIterator[str], *, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _events(first: RequestOutput, stream: RequestStream) -> AsyncIterator[RequestOutput]:
    """The request's outputs in order, the first one already read."""
    out = first
    yield out
    while not out.finished:
        out = await stream.next()
        yield out


def _chunk(request_id: str, model_name: str, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "id": request_id, "object": "text_completion", "created": int(time.time()), "model": model_name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def _usage(out: RequestOutput) -> dict[str, int]:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.generation_tokens,
            "total_tokens": out.prompt_tokens + out.generation_tokens}


async def _texts(
    first: RequestOutput, stream: RequestStream, tokenizer: Tokenizer, stops: tuple[str, ...],
    stop_request: Callable[[], None],
) -> AsyncIterator[tuple[str, RequestOutput]]:
    """(text to show, output) per output; a stop string ends the request in the core, finish reason ``stop``.

    After a stop string, tokens the core generated before the stop reached it are dropped.
    """
    decoder = tokenizer.stream()
    matcher = StopMatcher(stops)
    async for raw in _events(first, stream):
        out = raw
        stopped = matcher.stopped
        text = ""
        if out.token_id is not None and not out.is_stop_token:
            text = matcher.feed(decoder.step(out.token_id))
        if out.finished:
            text += matcher.flush()
            if matcher.stopped and out.finish_reason != "error":
                out = dataclasses.replace(out, finish_reason="stop")
        elif matcher.stopped:
            if stopped:
                continue
            stop_request()
        yield text, out


def _failure(engine: EngineCoreClient, out: RequestOutput) -> MoesloError | None:
    """The error that ended a request (None: it ended normally); no internal detail, that is in the log."""
    reason = engine.health()
    if out.finish_reason == "error":
        if reason is not None:
            return UnavailableError(f"the engine is unavailable: {reason}")
        return RequestFailedError(f"the engine could not complete request {out.request_id} ({out.error or 'failed'})")
    if out.finish_reason == "abort":
        return UnavailableError(f"request {out.request_id} was aborted by the engine"
                                + (f": {reason}" if reason is not None else ""))
    return None


async def _sse(
    texts: AsyncIterator[tuple[str, RequestOutput]], engine: EngineCoreClient, request_id: str, model_name: str,
    include_usage: bool,
) -> AsyncIterator[str]:
    """One SSE event per generated token, then ``[DONE]``; a failure is one ``error`` event (the error document)."""
    async for text, out in texts:
        error = _failure(engine, out)
        if error is not None:
            body = {"message": str(error), "type": type(error).__name__, "code": status_for(error)}
            yield f"data: {json.dumps({'id': request_id, 'error': body})}\n\n"
            break
        yield f"data: {json.dumps(_chunk(request_id, model_name, text, out.finish_reason))}\n\n"
        if out.finished and include_usage:
            usage = {**_chunk(request_id, model_name, "", None), "choices": [], "usage": _usage(out)}
            yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    texts: AsyncIterator[tuple[str, RequestOutput]],
    engine: EngineCoreClient,
    request_id: str,
    model_name: str,
    *,
    disconnected: asyncio.Future[None],
) -> Response:
    """Wait for the whole completion (the caller aborts it if the client goes away meanwhile)."""
    pieces: list[str] = []
    last: RequestOutput | None = None
    async for text, out in texts:
        pieces.append(text)
        last = out
    assert last is not None
    out = last
    if out.finish_reason == "abort" and disconnected.done() and not disconnected.cancelled():
        return Response(status_code=499)
    error = _failure(engine, out)
    if error is not None:
        return error_response(error)
    body = _chunk(request_id, model_name, "".join(pieces), out.finish_reason)
    body["usage"] = _usage(out)
    return JSONResponse(body)


def _expert_load_json(engine: EngineCoreClient) -> dict[str, Any]:
    load = engine.expert_load()
    placement = engine.placement
    if load is None:
        layers, ranks = placement.num_layers, placement.num_ranks
        experts = engine.num_experts
        return {"window_steps": engine.config.routing_window_steps, "steps_in_window": 0,
                "num_layers": layers, "num_experts": experts, "num_ranks": ranks,
                "expert_tokens": [[0] * experts for _ in range(layers)],
                "rank_tokens": [[0] * ranks for _ in range(layers)],
                "imbalance_cv": [0.0] * layers, "balancedness": [1.0] * layers, "assignments": [0] * layers}
    return {
        "window_steps": load.window_steps, "steps_in_window": load.steps_in_window,
        "num_layers": int(load.expert_tokens.shape[0]), "num_experts": int(load.expert_tokens.shape[1]),
        "num_ranks": int(load.rank_tokens.shape[1]),
        "expert_tokens": load.expert_tokens.tolist(), "rank_tokens": load.rank_tokens.tolist(),
        "imbalance_cv": load.imbalance_cv, "balancedness": load.balancedness, "assignments": load.assignments,
    }


class ServerThread:
    """uvicorn serving ``app`` on a background thread (tests, benchmarks, the demo)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int, log_level: str = "warning") -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.run, name="moeslo-http", daemon=True)

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise UnavailableError(f"HTTP server on {self.url} did not start within {timeout_s} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["CompletionRequest", "MetricsRenderer", "ServerThread", "create_app", "error_response", "status_for"]
