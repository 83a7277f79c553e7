"""One request of the OpenAI API from its token ids to the HTTP response: streamed as SSE, or whole.

Completions and chat completions differ only in their documents, which a
:class:`ResponseFormat` builds (``text_completion`` choices with ``text``;
``chat.completion`` choices with a ``message``, streamed as ``delta``s after
one role chunk).  The rest is shared: the first event is either the core's
refusal (400/429, raised before any byte is sent) or the first token; stop
strings are cut here (a stop found ends the request in the core with
``client.abort(request_id, "stop")``); a client that goes away has its
request aborted in the core, which frees its KV blocks, before the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from contracts.errors import MoesloError, UnavailableError
from engine.client import EngineCoreClient, RequestStream
from engine.engine_types import RequestOutput
from engine.errors import RequestFailedError
from engine.openai_errors import error_body, error_response
from engine.protocol import StopMatcher
from engine.sampling import SamplingParams
from engine.tokenizer import Tokenizer


class ResponseFormat(Protocol):
    """The documents of one kind of response (completion or chat)."""

    def opening(self, request_id: str) -> list[dict[str, Any]]:
        """Chunks sent before the first token's (chat: the assistant's role)."""
        ...

    def chunk(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]: ...

    def whole(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CompletionFormat:
    model_name: str

    def opening(self, request_id: str) -> list[dict[str, Any]]:
        return []

    def chunk(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]:
        return _document(request_id, "text_completion", self.model_name,
                         {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason})

    def whole(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]:
        return self.chunk(request_id, text, finish_reason)


@dataclass(frozen=True)
class ChatFormat:
    model_name: str

    def opening(self, request_id: str) -> list[dict[str, Any]]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [_document(request_id, "chat.completion.chunk", self.model_name, choice)]

    def chunk(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]:
        delta = {"content": text} if text or finish_reason is None else {}
        return _document(request_id, "chat.completion.chunk", self.model_name,
                         {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason})

    def whole(self, request_id: str, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return _document(request_id, "chat.completion", self.model_name,
                         {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason})


def _document(request_id: str, kind: str, model_name: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": model_name,
            "choices": [choice]}


def _usage(out: RequestOutput) -> dict[str, int]:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.generation_tokens,
            "total_tokens": out.prompt_tokens + out.generation_tokens}


@dataclass(frozen=True)
class Generation:
    """One request to run: its prompt, how it samples and stops, and how its response looks."""

    prompt_ids: list[int]
    params: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    format: ResponseFormat


async def serve_generation(
    engine: EngineCoreClient, tokenizer: Tokenizer, gen: Generation, request: Request, arrival_s: float
) -> Response:
    """Send ``gen`` to the core and answer with its completion, streamed or whole."""
    stream = engine.add_request(gen.prompt_ids, gen.params, arrival_s=arrival_s)
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
    texts = _texts(first, stream, tokenizer, gen.stops, lambda: engine.abort(request_id, "stop"))
    if gen.stream:
        return _EngineStreamingResponse(
            _sse(texts, engine, request_id, gen.format, gen.include_usage),
            on_close=close,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
        )
    try:
        return await _collect(texts, engine, request_id, gen.format, disconnected=watcher)
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
    texts: AsyncIterator[tuple[str, RequestOutput]], engine: EngineCoreClient, request_id: str,
    fmt: ResponseFormat, include_usage: bool,
) -> AsyncIterator[str]:
    """One SSE event per generated token, then ``[DONE]``; a failure is one ``error`` event (the error document)."""
    for opening in fmt.opening(request_id):
        yield f"data: {json.dumps(opening)}\n\n"
    async for text, out in texts:
        error = _failure(engine, out)
        if error is not None:
            yield f"data: {json.dumps({'id': request_id, 'error': error_body(error)})}\n\n"
            break
        yield f"data: {json.dumps(fmt.chunk(request_id, text, out.finish_reason))}\n\n"
        if out.finished and include_usage:
            usage = {**fmt.chunk(request_id, "", None), "choices": [], "usage": _usage(out)}
            yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    texts: AsyncIterator[tuple[str, RequestOutput]],
    engine: EngineCoreClient,
    request_id: str,
    fmt: ResponseFormat,
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
    body = fmt.whole(request_id, "".join(pieces), out.finish_reason)
    body["usage"] = _usage(out)
    return JSONResponse(body)


__all__ = ["ChatFormat", "CompletionFormat", "Generation", "ResponseFormat", "serve_generation"]
