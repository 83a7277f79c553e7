"""The proxy's request path: decide (admission, policy), send upstream, relay the answer.

One :class:`Router` per process holds the pool, the metrics and the
upstream client; the ASGI app (:mod:`router.app`) hands it each request.
A request's path::

    read body -> features -> admission (429 / queue) -> policy -> pool.begin
      -> upstream send (a refused connection ejects the replica; the request
         goes to the next choice, nothing having reached any engine)
      -> streamed (SSE): relay chunk by chunk, as received; a break mid-stream
         ejects the replica and ends the client's stream with an error event
      -> otherwise: read the whole answer, check it is what it claims, relay
    finally: pool.finish, one count of (replica, decision, outcome)

The whole path runs as one task beside a watch on the client's connection:
when the client goes away, the task is cancelled, and its ``finally``
closes the upstream response, so the engine sees the disconnect and aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from contracts.errors import MoesloError, OverloadedError, UnavailableError, ValidationError
from router.config import RouterConfig
from router.errors import UpstreamError, UpstreamTimeoutError, error_document, sse_error_event
from router.features import request_features
from router.metrics import RouterMetrics
from router.policies import admission, policy_named, predict
from router.pool import ReplicaPool, Ticket
from router.types import Choice, RequestFeatures
from router.wire import Receive, Send, read_body, send_json, upstream_headers

_RELAYED_HEADERS = (b"content-type", b"retry-after", b"cache-control")


@dataclass(slots=True)
class _Exchange:
    """One request's progress: what the client has been sent, and the outcome to count."""

    send: Send
    started: bool = False
    outcome: str = "client_disconnected"
    replica: str | None = None
    decision: str = "none"


class Router:
    def __init__(self, config: RouterConfig, *, registry: CollectorRegistry | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.config = config
        self.pool = ReplicaPool(config.replicas, prefill_tokens_per_s=config.prefill_tokens_per_s,
                                mean_prompt_tokens=config.mean_prompt_tokens, readmit_after=config.readmit_after)
        self.metrics = RouterMetrics(registry or CollectorRegistry(), config.replicas)
        self.policy = policy_named(config.policy, config.cost, affinity_blocks=config.affinity_blocks,
                                   load_factor=config.load_factor)  # fmt: skip
        limits = httpx.Limits(max_connections=config.max_connections, max_keepalive_connections=config.max_connections)
        timeout = httpx.Timeout(config.upstream_timeout_s, connect=config.connect_timeout_s)
        self.client = httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout)
        self.clock = clock
        self._turn = 0

    async def aclose(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------------ decisions

    async def decide(self, features: RequestFeatures) -> Choice:
        """Admission, then the policy; OverloadedError or UnavailableError when nobody can take it."""
        deadline = self.clock() + self.config.max_queue_s
        queued = False
        try:
            while (refusal := admission(features, self.pool.snapshot(), self.config.cost)) is not None:
                if refusal.retry_after_s is None:
                    raise UnavailableError("no healthy replica")
                wait_s = min(refusal.retry_after_s, self.config.scrape_interval_s, deadline - self.clock())
                if self.config.admission == "reject" or wait_s <= 0:
                    raise OverloadedError(f"every replica is predicted over the {self.config.cost.ttft_objective_s} s "
                                          f"TTFT objective (best {refusal.predicted_ttft_s:.3f} s)",
                                          retry_after_s=refusal.retry_after_s)  # fmt: skip
                if not queued:
                    queued = True
                    self.metrics.queued.inc()
                await asyncio.sleep(wait_s)
        finally:
            if queued:
                self.metrics.queued.dec()
        states = self.pool.snapshot()
        choice = self.policy(features, states, self._turn)
        self._turn += 1
        if choice.replica is None:
            raise UnavailableError("no healthy replica")
        if choice.predicted_ttft_s is None:
            state = next(s for s in states if s.name == choice.replica)
            choice = replace(choice, predicted_ttft_s=predict(state, features, self.config.cost).ttft_s)
        return choice

    def eject(self, name: str) -> None:
        if self.pool.eject(name):
            self.metrics.ejections[name].inc()
            self.metrics.healthy[name].set(0)

    # ------------------------------------------------------------------ completions

    async def completion(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """POST /v1/completions or /v1/chat/completions, watched for the client's disconnect."""
        started_s = self.clock()
        body = await read_body(receive)
        features = _features(body, scope, self.config.block_tokens)
        exchange = _Exchange(send)
        work = asyncio.ensure_future(self._complete(scope, features, body, exchange, started_s))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        self.metrics.request(exchange.replica, exchange.decision, exchange.outcome)
        if work.done() and not work.cancelled() and (failure := work.exception()) is not None:
            raise failure

    async def _complete(self, scope: dict[str, Any], features: RequestFeatures, body: bytes, exchange: _Exchange,
                        started_s: float) -> None:  # fmt: skip
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        headers = upstream_headers(scope["headers"])
        for _ in self.pool.names:
            try:
                choice = await self.decide(features)
            except MoesloError as exc:
                exchange.outcome = "rejected" if isinstance(exc, OverloadedError) else "unavailable"
                exchange.decision = "all_over_budget" if isinstance(exc, OverloadedError) else "no_healthy_replica"
                await _send_error(exchange, exc)
                return
            exchange.replica, exchange.decision = choice.replica, choice.reason
            if await self._attempt(choice, features, path, body, headers, exchange, started_s):
                return
        exchange.outcome = "unavailable"
        await _send_error(exchange, UnavailableError("every replica refused the connection"))

    async def _attempt(self, choice: Choice, features: RequestFeatures, path: str, body: bytes,
                       headers: list[tuple[bytes, bytes]], exchange: _Exchange, started_s: float) -> bool:  # fmt: skip
        """One try on the chosen replica; False when its connection was refused (try another)."""
        name = choice.replica
        assert name is not None
        ticket = self.pool.begin(name, features.prompt_tokens)
        self.metrics.outstanding[name].inc()
        if choice.predicted_ttft_s is not None:
            self.metrics.predicted(name, choice.predicted_ttft_s)
        request = self.client.build_request("POST", name + path, content=body, headers=headers)
        sent_s = self.clock()
        self.metrics.overhead.observe(sent_s - started_s)
        try:
            upstream = await self.client.send(request, stream=True)
        except httpx.ConnectError:
            self._done(ticket)
            self.eject(name)
            self.metrics.request(name, choice.reason, "upstream_error")
            return False
        except httpx.TransportError as exc:
            self._done(ticket)
            self.eject(name)
            exchange.outcome = "upstream_error"
            await _send_error(exchange, _upstream_error(exc, name))
            return True
        try:
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                await self._relay(upstream, ticket, choice, exchange, sent_s)
            else:
                await self._relay_whole(upstream, name, exchange)
        finally:
            await upstream.aclose()
            self._done(ticket)
        return True

    def _done(self, ticket: Ticket) -> None:
        if not ticket.finished:
            self.pool.finish(ticket)
            self.metrics.outstanding[ticket.replica].dec()

    async def _relay(self, upstream: httpx.Response, ticket: Ticket, choice: Choice, exchange: _Exchange,
                     sent_s: float) -> None:  # fmt: skip
        """Pass an SSE stream through chunk by chunk; a break ends it with an error event and ejects."""
        send = exchange.send
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": _relayed(upstream)})  # fmt: skip
        exchange.started = True
        try:
            async for chunk in upstream.aiter_raw():
                if not ticket.started:
                    self.pool.first_token(ticket)
                    self.metrics.observed(ticket.replica, self.clock() - sent_s, choice.predicted_ttft_s)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as exc:
            self.eject(ticket.replica)
            exchange.outcome = "upstream_failed_mid_stream"
            await send({"type": "http.response.body", "body": sse_error_event(_upstream_error(exc, ticket.replica)),
                        "more_body": False})  # fmt: skip
            return
        exchange.outcome = "ok" if upstream.status_code < 400 else "upstream_status"
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_whole(self, upstream: httpx.Response, name: str, exchange: _Exchange) -> None:
        """Read a whole answer; relay it when it is the JSON it claims to be, else a 502 naming the replica."""
        try:
            content = await upstream.aread()
        except httpx.TransportError as exc:
            self.eject(name)
            exchange.outcome = "upstream_error"
            await _send_error(exchange, _upstream_error(exc, name))
            return
        problem = _check_answer(upstream, content)
        if problem is not None:
            exchange.outcome = "upstream_error"
            await _send_error(exchange, UpstreamError(f"replica {name} answered {problem}", replica=name))
            return
        exchange.outcome = "ok" if upstream.status_code < 400 else "upstream_status"
        await exchange.send({"type": "http.response.start", "status": upstream.status_code,
                             "headers": _relayed(upstream)})  # fmt: skip
        exchange.started = True
        await exchange.send({"type": "http.response.body", "body": content, "more_body": False})


def _features(body: bytes, scope: dict[str, Any], block_tokens: int) -> RequestFeatures:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"body: not JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise ValidationError("body: must be a JSON object")
    chat = scope["path"].endswith("/chat/completions")
    return request_features(payload, chat=chat, block_tokens=block_tokens)


def _check_answer(upstream: httpx.Response, content: bytes) -> str | None:
    """What is wrong with a whole answer (None: relay it): JSON that does not parse, or a non-JSON error."""
    is_json = "json" in upstream.headers.get("content-type", "")
    if is_json:
        try:
            json.loads(content)
        except (ValueError, UnicodeDecodeError):
            return f"HTTP {upstream.status_code} with a body that is not the JSON it claims"
        return None
    if upstream.status_code >= 400 or upstream.status_code < 200:
        return f"HTTP {upstream.status_code} without a JSON error document"
    return None


def _relayed(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in upstream.headers.raw if k.lower() in _RELAYED_HEADERS]


def _upstream_error(exc: httpx.TransportError, name: str) -> UpstreamError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError(f"replica {name} did not answer in time ({type(exc).__name__})", replica=name)
    return UpstreamError(f"replica {name} broke the connection ({type(exc).__name__}: {exc})", replica=name)


async def _send_error(exchange: _Exchange, exc: MoesloError) -> None:
    if exchange.started:
        return
    status, body, headers = error_document(exc)
    exchange.started = True
    await send_json(exchange.send, status, body, headers)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = ["Router"]
