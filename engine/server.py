"""The OpenAI-compatible HTTP API, in the API process, over an :class:`~engine.client.EngineCoreClient`.

Routes: ``POST /v1/completions`` (text or token-id prompts) and ``POST
/v1/chat/completions`` (messages rendered with the checkpoint's chat
template), each streamed as server-sent events or whole; ``GET /v1/models``
and ``GET /v1/models/{id}``; vLLM's ``POST /tokenize`` and ``POST /detokenize``;
``GET /health``; ``GET /metrics`` (rendered by whatever ``metrics`` callable the
caller wires in: this module imports no exporter); and the controller's control
routes ``GET/POST /v1/placement`` and ``GET /v1/expert-load``.

This process validates and tokenizes requests, detokenizes outputs and
writes SSE; the engine core (its own process) schedules and runs the model.
A request's path: validate (400 naming the field) -> render the chat
template -> tokenize (a long text on a worker thread, :func:`off_loop`: the
event loop keeps streaming the others) -> check what the API side knows (vocabulary, context)
-> send to the core -> stream or collect (:mod:`engine.openai_serving`).

Every failure, 404s included, is OpenAI's error document, and HTTP status
codes are mapped from the error hierarchy in one place
(:mod:`engine.openai_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.asgi import UnexpectedErrors
from contracts.errors import MoesloError, NotFoundError, PlacementError, UnavailableError, ValidationError
from contracts.lifetime import DEFAULT_SHUTDOWN_TIMEOUT_S
from contracts.placement import Placement
from engine.chat_template import ChatTemplate
from engine.client import EngineCoreClient
from engine.openai_chat import ChatCompletionRequest
from engine.openai_documents import ChatFormat, CompletionFormat
from engine.openai_errors import (
    UNAVAILABLE_RETRY_AFTER_S,
    error_document,
    error_response,
    http_error_body,
    loc_path,
    status_for,
)
from engine.openai_serving import Generation, serve_generation
from engine.openai_tokenize import DetokenizeRequest, TokenizeRequest
from engine.protocol import CompletionRequest, GenerationRequest, check_output_limit
from engine.tokenizer import Tokenizer

MetricsRenderer = Callable[[], tuple[bytes, str]]
"""Returns the ``/metrics`` body and its media type."""

log = logging.getLogger("moeslo.engine_server")

OFF_LOOP_SIZE = 4096
"""Texts (and token-id lists) at least this long are tokenized, detokenized or rendered on a worker thread."""

_T = TypeVar("_T")
_Request = TypeVar("_Request", bound=GenerationRequest)


async def off_loop(size: int, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)``: inline when ``size`` is small, else on a worker thread (as vLLM's async tokenizer).

    A 3 MB prompt tokenizes for seconds; on the event loop that stalled every other stream as long.
    """
    if size < OFF_LOOP_SIZE:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def create_app(
    engine: EngineCoreClient,
    tokenizer: Tokenizer,
    *,
    model_name: str,
    metrics: MetricsRenderer | None = None,
    on_shutdown: Iterable[Callable[[], None]] = (),
    chat_template: ChatTemplate | None = None,
    sampling_defaults: Mapping[str, float | int] | None = None,
) -> FastAPI:
    """The API app; it starts the engine core on startup (if not yet) and stops it (and ``on_shutdown``) on exit.

    Without a ``chat_template``, ``/v1/chat/completions`` answers 400.  ``sampling_defaults`` (the
    checkpoint's generation config: :func:`engine.generation_config.sampling_defaults`) fill the sampling
    fields a request leaves out.
    """
    hooks = list(on_shutdown)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.start)
        gc.collect()
        gc.freeze()  # start-up's objects stay: full collections need not walk them while streaming
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)
            for hook in hooks:
                hook()

    app = FastAPI(title="moeslo engine", lifespan=lifespan)
    app.add_middleware(UnexpectedErrors, answer=_internal_error)
    _install_error_handlers(app)
    _add_control_routes(app, engine, metrics)
    _add_openai_routes(app, engine, tokenizer, model_name, chat_template, dict(sampling_defaults or {}))
    _add_tokenize_routes(app, engine, tokenizer, model_name, chat_template)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure as the one error document (:func:`error_response`); details of the unexpected go to the log."""

    @app.exception_handler(MoesloError)
    async def _moeslo_error(_: Request, exc: MoesloError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> Response:
        return error_response(ValidationError([_body_problem(err) for err in exc.errors()]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):  # FastAPI's "error parsing the body"
            return error_response(ValidationError(f"body: not valid JSON: {exc.__cause__}"))
        message = str(exc.detail)
        if exc.status_code in (404, 405):
            message = f"{message}: {request.method} {request.url.path}"
        body = http_error_body(exc.status_code, message)
        return error_document(body, exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # Reached only by a failure after the response started (UnexpectedErrors answers the others); the
        # connection is closed then, as a half-sent response must be.
        log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
        return _internal_error()


def _body_problem(err: Mapping[str, Any]) -> str:
    """One of pydantic's (or FastAPI's) errors as ``field: message``; a body that is not JSON names ``body``."""
    if err.get("type") == "json_invalid":  # loc is ("body", position)
        position = err.get("loc", ())[-1]
        return f"body: not valid JSON: {err.get('ctx', {}).get('error', 'invalid')} at character {position}"
    parts = [p for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "extra_forbidden":  # its last part is the unknown key as sent, never a type tag
        key = ".".join(filter(None, (loc_path(parts[:-1]), str(parts[-1]))))
        return f"{key}: not supported by this engine"
    loc = loc_path(parts) or "body"
    return f"{loc}: {err.get('msg', 'invalid')}"


def _internal_error() -> Response:
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


def _add_openai_routes(
    app: FastAPI, engine: EngineCoreClient, tokenizer: Tokenizer, model_name: str, chat_template: ChatTemplate | None,
    defaults: dict[str, float | int],
) -> None:
    """``/v1/models``, ``/v1/models/{id}``, ``/v1/completions`` and ``/v1/chat/completions``."""
    created = int(time.time())

    def card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "moeslo",
                "max_model_len": engine.max_model_len}

    def check_model(body: _Request) -> _Request:
        """The request with the model's defaults, once it names this model and asks what the engine serves."""
        _check_model_name(body.model, model_name)
        body = body.with_defaults(defaults)
        body.check()
        return body

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise NotFoundError("model", model_id)
        return card()

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival_s = time.monotonic()
        body = check_model(body)
        encode = functools.partial(tokenizer.encode, add_special_tokens=body.add_special_tokens)
        prompts = [await off_loop(len(p), encode, p) if isinstance(p, str) else list(p) for p in body.prompts]
        engine.check_prompt_ids(t for p in body.prompts if not isinstance(p, str) for t in p)  # before echo decodes
        echo = [p if isinstance(p, str) else await off_loop(len(p), tokenizer.decode, list(p))
                for p in body.prompts] if body.echo else None
        check_output_limit("max_tokens", body.max_tokens, engine.max_model_len)
        gen = Generation(prompts, body.sampling_params(body.tokens_to_generate), body.stop_strings, body.stream,
                         body.include_usage, CompletionFormat(model_name), n=body.n, echo=echo,
                         echo_only=body.max_tokens == 0, continuous_usage=body.continuous_usage)
        return await serve_generation(engine, tokenizer, gen, request, arrival_s)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival_s = time.monotonic()
        sent = body.token_limit  # a limit the generation config gives is cut to the context, never refused
        body = check_model(body)
        prompt = await _render_chat(chat_template, body)
        prompt_ids = await off_loop(len(prompt), tokenizer.encode, prompt)
        if sent is not None:
            field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            check_output_limit(field, sent, engine.max_model_len)
        # Left out, the completion may fill the context (as OpenAI and vLLM do): serve_generation cuts it.
        limit = min(body.token_limit or engine.max_model_len, engine.max_model_len)
        gen = Generation([prompt_ids], body.sampling_params(limit), body.stop_strings, body.stream,
                         body.include_usage, ChatFormat(model_name), n=body.n, prompt_field="messages",
                         continuous_usage=body.continuous_usage)
        return await serve_generation(engine, tokenizer, gen, request, arrival_s)


def _check_model_name(asked: str | None, model_name: str) -> None:
    """A request that names a model names this one (404 else, as vLLM answers)."""
    if asked is not None and asked != model_name:
        raise NotFoundError("model", asked)


def _add_tokenize_routes(app: FastAPI, engine: EngineCoreClient, tokenizer: Tokenizer, model_name: str,
                         chat_template: ChatTemplate | None) -> None:
    """vLLM's ``/tokenize`` and ``/detokenize`` (:mod:`engine.openai_tokenize`)."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        _check_model_name(body.model, model_name)
        body.check()
        chat = body.as_chat()
        text = await _render_chat(chat_template, chat) if chat is not None else body.prompt or ""
        tokens = await off_loop(len(text), functools.partial(tokenizer.encode, text,
                                                             add_special_tokens=body.special_tokens))
        return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        _check_model_name(body.model, model_name)
        body.check(engine.vocab_size)
        return {"prompt": await off_loop(len(body.tokens), tokenizer.decode, body.tokens)}


async def _render_chat(chat_template: ChatTemplate | None, body: ChatCompletionRequest) -> str:
    """The chat's prompt text, rendered with the checkpoint's template (a long one on a worker thread)."""
    if chat_template is None:
        raise ValidationError("messages: this model has no chat template (tokenizer_config.json's "
                              "chat_template), so it serves /v1/completions only")
    messages = body.template_messages()
    return await off_loop(sum(len(m["content"]) for m in messages), functools.partial(
        chat_template.render, messages, add_generation_prompt=body.add_generation_prompt,
        extra=body.template_variables()))


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
                "imbalance_cv": [0.0] * layers, "balancedness": [1.0] * layers, "assignments": [0] * layers,
                "expert_tokens_total": None}
    return {
        "window_steps": load.window_steps, "steps_in_window": load.steps_in_window,
        "num_layers": int(load.expert_tokens.shape[0]), "num_experts": int(load.expert_tokens.shape[1]),
        "num_ranks": int(load.rank_tokens.shape[1]),
        "expert_tokens": load.expert_tokens.tolist(), "rank_tokens": load.rank_tokens.tolist(),
        "imbalance_cv": load.imbalance_cv, "balancedness": load.balancedness, "assignments": load.assignments,
        "expert_tokens_total": None if load.expert_tokens_total is None else load.expert_tokens_total.tolist(),
    }


class ServerThread:
    """uvicorn serving ``app`` on a background thread (tests, benchmarks, the demo)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int, log_level: str = "warning") -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=DEFAULT_SHUTDOWN_TIMEOUT_S)
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


__all__ = [
    "ChatCompletionRequest", "CompletionRequest", "MetricsRenderer", "ServerThread", "create_app", "error_response",
    "status_for",
]
