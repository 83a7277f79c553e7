"""One request of the OpenAI API from its token ids to the HTTP response: streamed as SSE, or whole.

Completions and chat completions differ only in their documents, which a
:class:`~engine.openai_documents.ResponseFormat` builds.  The rest is shared: the first event is either the core's
refusal (400/429, raised before any byte is sent) or the first token; stop
strings are cut here (a stop found ends the request in the core with
``client.abort(request_id, "stop")``); a client that goes away has its
request aborted in the core, which frees its KV blocks, before the next step.

``n`` > 1 and lists of prompts fan out here: every choice is its own request
in the core (the core schedules them like any others), and their outputs are
merged as they come; a choice that fails fails the response.  The choices'
statistics come back together (:class:`~engine.request_stream.ChoiceGroup`,
under the response's id and operation) for what is observed once per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from contracts.errors import MoesloError, UnavailableError
from engine.client import EngineCoreClient
from engine.engine_types import RequestOutput
from engine.errors import RequestFailedError
from engine.openai_documents import ChoiceResult, Piece, ResponseFormat, StopReason, response_id
from engine.openai_errors import error_body, error_response
from engine.openai_logprobs import LogprobEntry, logprob_entry, prompt_entries
from engine.protocol import StopMatcher, fit_to_context
from engine.request_stream import ChoiceGroup, RequestStream
from engine.sampling import MAX_SEED, SamplingParams
from engine.stats import CHAT
from engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class Generation:
    """One API request to run: its prompts, how each samples and stops, and how the response looks.

    Choice ``i`` is sample ``i % n`` of prompt ``i // n`` (OpenAI's order).
    With a seed, sample ``j`` of a prompt draws with ``seed + j``, so the ``n``
    choices differ and each is reproducible.
    """

    prompts: list[list[int]]
    params: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    format: ResponseFormat
    n: int = 1
    echo: list[str] | None = None
    """Per prompt, the text shown before its choices' text (a completion's ``echo``)."""
    echo_only: bool = False
    """Show the echoed prompt alone (``max_tokens`` 0): the token the core generates is dropped."""
    prompt_field: str = "prompt"
    """The request field the prompts came from (a chat's ``messages``), named by a too-long prompt's 400."""
    continuous_usage: bool = False
    """Every chunk carries its choice's usage so far (vLLM's ``continuous_usage_stats``)."""

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def choices(self, max_model_len: int, context_note: str | None = None) -> list[tuple[list[int], SamplingParams]]:
        """Every choice's prompt and parameters, ``max_tokens`` cut to the context its prompt leaves."""
        fitted = [fit_to_context(self.params, len(prompt), max_model_len, field=self.prompt_field,
                                 context_note=context_note) for prompt in self.prompts]
        return [(prompt, self._sample_params(params, j)) for prompt, params in zip(self.prompts, fitted, strict=True)
                for j in range(self.n)]

    @staticmethod
    def _sample_params(params: SamplingParams, j: int) -> SamplingParams:
        seed = params.seed
        if j == 0 or seed is None:
            return params
        return dataclasses.replace(params, seed=seed + j if seed + j <= MAX_SEED else seed - j)

    def choice_usage(self, index: int, completion_tokens: int) -> dict[str, int]:
        """Choice ``index``'s usage so far: its prompt's tokens and the tokens it generated."""
        prompt = len(self.prompts[index // self.n])
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}

    def usage(self, last: list[RequestOutput]) -> dict[str, int]:
        """Prompt tokens once per prompt, completion tokens of every choice."""
        prompt = sum(out.prompt_tokens for i, out in enumerate(last) if i % self.n == 0)
        completion = sum(out.generation_tokens for out in last)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def serve_generation(
    engine: EngineCoreClient, tokenizer: Tokenizer, gen: Generation, request: Request, arrival_s: float
) -> Response:
    """Send every choice of ``gen`` to the core and answer with the completions, streamed or whole."""
    streams: list[RequestStream] = []

    def end_early() -> None:
        for stream in streams:
            if not stream.finished:
                engine.abort(stream.request_id)

    def close() -> None:
        watcher.cancel()
        end_early()
        for stream in streams:  # a choice whose final output was never read counts as far as it was read
            stream.stop_reading()

    # Every prompt is checked (its length against the context, the rest as the client checks it) before any
    # is sent: a refused one must leave none running in the core.  A prompt's n choices differ only by seed.
    choices = gen.choices(engine.max_model_len, engine.context_note)
    for prompt, params in choices[:: gen.n]:
        engine.check_prompt(prompt, params)
    # The statistics observed once per API request (one span, the most tokens of a prompt's choices) wait for
    # every choice; they name the request by the id its client reads.
    first_id = f"cmpl-{uuid.uuid4().hex}"
    group = ChoiceGroup(response_id(first_id, chat=gen.format.operation == CHAT), gen.format.operation, gen.n)
    # From now until the request ends, a client that goes away aborts it in the core.
    watcher = asyncio.ensure_future(_until_disconnect(request))
    watcher.add_done_callback(lambda w: None if w.cancelled() else end_early())
    try:
        for i, (prompt, params) in enumerate(choices):
            streams.append(engine.add_request(prompt, params, arrival_s=arrival_s, group=group, choice=i,
                                              request_id=None if i else first_id,
                                              checks_stops=bool(gen.stops) and not gen.echo_only))
        group.seal()
        # The core's refusal (400, 429) raises here, before any byte is sent.
        firsts = [await stream.next() for stream in streams]
    except BaseException:
        group.seal()
        close()
        raise
    eos = tuple(engine.eos_token_ids)
    texts = [_choice(first, stream, tokenizer, gen, i // gen.n, functools.partial(engine.abort, stream.request_id,
                                                                                   "stop"), eos)
             for i, (first, stream) in enumerate(zip(firsts, streams, strict=True))]
    request_id = streams[0].request_id
    if gen.stream:
        return _EngineStreamingResponse(
            _sse(_merged(texts), engine, request_id, gen),
            on_close=close,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
        )
    try:
        return await _collect(_merged(texts), engine, request_id, gen, disconnected=watcher)
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


def _choice(first: RequestOutput, stream: RequestStream, tokenizer: Tokenizer, gen: Generation, prompt_index: int,
            stop_request: Callable[[], object], eos_token_ids: tuple[int, ...]) -> AsyncIterator[Piece]:
    """What one choice shows, output by output (with ``echo``, its prompt first)."""
    prompt = gen.prompts[prompt_index]
    if gen.echo is None:
        return _texts(first, stream, tokenizer, gen, stop_request, eos_token_ids, prompt)
    prefix = gen.echo[prompt_index]
    if gen.echo_only:
        return _echo_only(first, stream, tokenizer, gen, prefix, prompt)
    return _texts(first, stream, tokenizer, gen, stop_request, eos_token_ids, prompt, prefix=prefix, echo=True)


def _echoed_entries(tokenizer: Tokenizer, gen: Generation, prompt: list[int] | None,
                    out: RequestOutput) -> list[LogprobEntry]:
    """The prompt's logprob entries, for an echoing request that asked for logprobs (else none)."""
    if prompt is None or gen.params.prompt_logprobs is None or out.prompt_logprobs is None:
        return []
    return prompt_entries(tokenizer, prompt, out.prompt_logprobs)


async def _echo_only(first: RequestOutput, stream: RequestStream, tokenizer: Tokenizer, gen: Generation,
                     prefix: str, prompt: list[int]) -> AsyncIterator[Piece]:
    """The prompt alone (``max_tokens`` 0), once the core's one token is out; finish reason ``length``."""
    entries = _echoed_entries(tokenizer, gen, prompt, first)
    out = first
    async for event in _events(first, stream):
        out = event
    if out.finish_reason in ("stop", "length"):
        out = dataclasses.replace(out, finish_reason="length", is_stop_token=False, generation_tokens=0)
    yield Piece(prefix, out, entries if gen.params.logprobs is not None else None)


async def _texts(
    first: RequestOutput, stream: RequestStream, tokenizer: Tokenizer, gen: Generation,
    stop_request: Callable[[], object], eos_token_ids: tuple[int, ...], prompt: list[int], *, prefix: str = "",
    echo: bool = False,
) -> AsyncIterator[Piece]:
    """What each output shows (the first after ``prefix``); a stop string ends the request, finish reason ``stop``.

    A stop string counts once more than ``min_tokens`` tokens are out, if it
    ends in a later token's text; it may begin in the first ``min_tokens``
    tokens' text (as vLLM's).  After a stop string, tokens the core generated
    before the stop reached it are dropped.  An echoed ``prompt``'s logprobs come first, with the first
    output (as vLLM's).  Text offsets are vLLM's running sum of the listed tokens' texts, from the end of
    ``prefix`` (from the end of the prompt entries, where the echo has them): a multi-byte character split over
    tokens counts each token's text, not the decoded text.  The text continues the prompt's, as vLLM's.
    """
    decoder = tokenizer.stream(prompt)
    matcher = StopMatcher(gen.stops)
    min_tokens, want_logprobs = gen.params.min_tokens, gen.params.logprobs is not None
    tokens = 0
    tokens_at_stop: int | None = None  # usage counts the tokens up to the stop string, as vLLM's does
    offset = len(prefix)
    listed: list[int] = []  # the tokens listed so far: a split character's text is completed with them
    async for raw in _events(first, stream):
        out = raw
        stopped = matcher.stopped
        text = ""
        entries: list[LogprobEntry] | None = [] if want_logprobs else None
        if entries is not None and out is first:
            entries += _echoed_entries(tokenizer, gen, prompt if echo else None, out)
            if entries:
                offset = entries[-1].text_offset + len(entries[-1].token)
        if entries is not None and out.is_stop_token and out.token_id is not None and out.logprobs is not None \
                and not stopped:  # listed though not shown, as vLLM lists it
            entries.append(logprob_entry(tokenizer, out.token_id, out.logprobs, offset, listed))
            offset += len(entries[-1].token)
        if out.token_id is not None and not out.is_stop_token:
            tokens += 1
            piece = decoder.step(out.token_id)
            text = matcher.feed(piece, check=tokens > min_tokens)
            if entries is not None and out.logprobs is not None and not stopped:
                entries.append(logprob_entry(tokenizer, out.token_id, out.logprobs, offset, listed))
                offset += len(entries[-1].token)
                listed.append(out.token_id)
            if matcher.stopped and tokens_at_stop is None:
                tokens_at_stop = tokens
        if out.finished:
            text += matcher.flush()
            if matcher.stopped and out.finish_reason != "error":
                out = dataclasses.replace(out, finish_reason="stop",
                                          generation_tokens=tokens if tokens_at_stop is None else tokens_at_stop)
            stream.settle(out.finish_reason or "error", out.generation_tokens)  # the statistics count this
        elif matcher.stopped:
            if stopped:
                continue
            stream.stop_found(tokens if tokens_at_stop is None else tokens_at_stop)
            stop_request()
        yield Piece(prefix + text, out, entries, _stop_reason(out, matcher, gen.params, eos_token_ids))
        prefix = ""


def _stop_reason(out: RequestOutput, matcher: StopMatcher, params: SamplingParams,
                 eos_token_ids: tuple[int, ...]) -> StopReason:
    """What ended a choice that ended with finish reason ``stop``, as vLLM names it.

    None for the tokenizer's eos (the first of ``eos_token_ids``) unless the request ignores eos, even if it
    lists it in ``stop_token_ids`` too (vLLM checks eos first); the id of a ``stop_token_ids`` token and of
    the other eos tokens (vLLM makes generation_config's extra eos ids stop token ids).
    """
    if not out.finished or out.finish_reason != "stop":
        return None
    if matcher.stopped:
        return matcher.found
    token = out.token_id
    if not out.is_stop_token or token is None or (eos_token_ids[:1] == (token,) and not params.ignore_eos):
        return None
    return token if token in params.stop_token_ids or token in eos_token_ids else None


async def _merged(texts: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    """(choice index, piece) of every choice as they come; one choice is read directly."""
    if len(texts) == 1:
        async for piece in texts[0]:
            yield 0, piece
        return
    queue: asyncio.Queue[tuple[int, Piece] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, choice: AsyncIterator[Piece]) -> None:
        try:
            async for piece in choice:
                queue.put_nowait((index, piece))
        except Exception as exc:  # handed to the reader, which raises it
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(i, choice)) for i, choice in enumerate(texts)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


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
    merged: AsyncIterator[tuple[int, Piece]], engine: EngineCoreClient, request_id: str, gen: Generation,
) -> AsyncIterator[str]:
    """One SSE event per generated token, then ``[DONE]``; a failure is one ``error`` event (the error document)."""
    fmt = gen.format
    last: list[RequestOutput | None] = [None] * gen.num_choices
    generated = [0] * gen.num_choices
    for i, opening in enumerate(fmt.opening(request_id, gen.num_choices)):
        if gen.continuous_usage:
            opening["usage"] = gen.choice_usage(i, 0)
        yield f"data: {json.dumps(opening)}\n\n"
    failed = False
    async for index, piece in merged:
        error = _failure(engine, piece.out)
        if error is not None:
            yield f"data: {json.dumps({'id': request_id, 'error': error_body(error)})}\n\n"
            failed = True
            break
        chunk = fmt.chunk(request_id, index, piece)
        if gen.continuous_usage:  # the core counts a choice's tokens on its last output
            generated[index] = piece.out.generation_tokens if piece.out.finished \
                else generated[index] + (piece.out.token_id is not None)
            chunk["usage"] = gen.choice_usage(index, generated[index])
        yield f"data: {json.dumps(chunk)}\n\n"
        if piece.out.finished:
            last[index] = piece.out
    if gen.include_usage and not failed:
        done = [out for out in last if out is not None]
        yield f"data: {json.dumps(fmt.usage_chunk(request_id, gen.usage(done)))}\n\n"
    yield "data: [DONE]\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    merged: AsyncIterator[tuple[int, Piece]],
    engine: EngineCoreClient,
    request_id: str,
    gen: Generation,
    *,
    disconnected: asyncio.Future[None],
) -> Response:
    """Wait for every choice (the caller aborts them if the client goes away meanwhile)."""
    texts: list[list[str]] = [[] for _ in range(gen.num_choices)]
    logprobs: list[list[LogprobEntry] | None] = [None] * gen.num_choices
    last: list[Piece | None] = [None] * gen.num_choices
    async for index, piece in merged:
        texts[index].append(piece.text)
        if piece.logprobs is not None:  # extended in place: a new list per token was quadratic in its length
            logprobs[index] = entries = logprobs[index] or []
            entries.extend(piece.logprobs)
        last[index] = piece
    ends = [piece for piece in last if piece is not None]
    ended = [piece.out for piece in ends]
    assert len(ended) == gen.num_choices
    if any(out.finish_reason == "abort" for out in ended) and disconnected.done() and not disconnected.cancelled():
        return Response(status_code=499)
    for out in ended:
        error = _failure(engine, out)
        if error is not None:
            return error_response(error)
    body = gen.format.whole(request_id, [ChoiceResult("".join(t), end.out.finish_reason, end.stop_reason, lp)
                                         for t, end, lp in zip(texts, ends, logprobs, strict=True)])
    body["usage"] = gen.usage(ended)
    return JSONResponse(body)


__all__ = ["Generation", "serve_generation"]
