"""The proxy's request path: decide (admission, policy), send upstream, relay the answer.

One :class:`Router` per process holds the pool, the metrics and the
upstream client; the ASGI app (:mod:`router.app`) hands it each request.
A request's path::

    read body -> features -> admission (429 / queue) -> policy -> pool.begin
      -> upstream send (a refused or timed-out connect ejects the replica; the
         request goes to the next choice, nothing having reached any engine; queue
         mode holds it for what is left of its wait)
      -> streamed (SSE): relay chunk by chunk, as received; a break mid-stream
         ejects the replica and ends the client's stream with an error event
         (a break after its [DONE] ends it as usual: the answer is whole)
      -> otherwise: read the whole answer, check it is what it claims, relay
    finally: pool.finish, one count of (replica, decision, outcome)

The server (:mod:`router.app`) cancels the path when the client goes away;
its ``finally`` blocks then close the upstream response (its connection
goes too), so the engine sees the disconnect and aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from contracts.catalogue import REJECTED_OUTCOME
from contracts.errors import MoesloError, OverloadedError, UnavailableError, ValidationError
from router.config import RouterConfig
from router.errors import UpstreamError, UpstreamTimeoutError, error_document, sse_error_event, upstream_error
from router.features import body_features
from router.held import HeldRequests
from router.metrics import INVALID_REQUEST_OUTCOME, RouterMetrics
from router.policies import admission, healthy, over_objective_alone, policy_named, predict, prefill_work
from router.pool import ReplicaPool, Ticket
from router.prefix_index import PrefixIndex, with_cached_tokens
from router.types import Choice, ReplicaState, RequestFeatures
from router.wire import ClientGone, Send, StreamErrors, relayed_headers, send_bytes, send_json, upstream_headers

_log = logging.getLogger(__name__)
SSE_DONE = b"data: [DONE]\n\n"  # the OpenAI stream's last event
UPSTREAM_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError)
"""What a broken, garbled or silent upstream raises (a refused connection is one: ``ClientConnectorError``)."""


@dataclass(slots=True)
class _Tries:
    """What a request's earlier tries leave to its next: its deadline in queue mode.  (The replica a try failed on
    is ejected, so out of the next choice until readmitted; left out after its readmission too, it kept the
    request, first in line, and everyone behind it waiting while it stood idle.)"""

    deadline_s: float | None = None
    """When its wait in line ends (``max_queue_s`` from its first): one wait per request, however many tries."""


@dataclass(slots=True)
class _Exchange:
    """One request's progress: what the client has been sent, and the outcome to count."""

    send: Send
    started: bool = False
    outcome: str = "client_disconnected"
    replica: str | None = None
    decision: str = "none"
    answered: bool = False
    """The client has the whole answer (a stream's ``[DONE]``): leaving afterwards is not a disconnect."""
    abandoned: bool = False
    """Its replica stopped answering (ejected as frozen): the wait was cancelled, the client gets an error."""
    tried: bool = False
    """A replica has been tried (a further try follows a connection refused or not accepted, or a 503, there)."""
    held_s: float = 0.0
    """Seconds held at admission (queue mode): the fleet's wait, left out of the router's overhead."""
    heard_s: float = 0.0
    """When its replica last gave a sign of life for it: sent there, its headers, each relayed chunk."""
    tail: bytes = b""
    """The last bytes relayed of a stream: whether it stopped between two events or inside one."""
    errors: StreamErrors = field(default_factory=StreamErrors)

    def error_event(self, error: MoesloError) -> bytes:
        """``error`` as the stream's last event; a stream broken inside an event has that event ended first, so
        the error reaches the client as an event of its own."""
        cut = b"" if not self.tail or self.tail.endswith(b"\n\n") else b"\n\n"
        return cut + sse_error_event(error)


class Router:
    def __init__(self, config: RouterConfig, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.config = config
        self.pool = ReplicaPool(config.replicas, prefill_tokens_per_s=config.prefill_tokens_per_s,
                                mean_prompt_tokens=config.mean_prompt_tokens, readmit_after=config.readmit_after,
                                eject_after_silent=config.eject_after_silent, eject_after_5xx=config.eject_after_5xx)
        self.metrics = RouterMetrics(registry or CollectorRegistry(), config.replicas)
        self.policy = policy_named(config.policy, config.cost, affinity_blocks=config.affinity_blocks,
                                   load_factor=config.load_factor)  # fmt: skip
        self.prefixes = PrefixIndex(max(1, config.prefix_cache_tokens // config.block_tokens))
        """The prompt blocks sent to each replica: what its prefix cache likely holds."""
        self._session: aiohttp.ClientSession | None = None
        self.clock = clock
        self._turn = 0
        self.held = HeldRequests()
        """Queue mode: the requests held at admission, first come, first served."""
        self.pool.on_change = self.held.wake
        self._in_flight: dict[str, dict[asyncio.Task[Any], _Exchange]] = {}
        """Per replica, the requests waiting on it (their tasks): a frozen replica's are ended, not left waiting."""

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client (made on first use, inside the server's event loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # Idle connections go after 4 s, before uvicorn's 5 s keep-alive closes them under a request.
                connector=aiohttp.TCPConnector(limit=self.config.max_connections, limit_per_host=0,
                                               keepalive_timeout=4.0),
                # sock_connect, not connect: a wait for a free pooled connection is the router's, never the replica's.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s,
                                              sock_read=self.config.upstream_timeout_s),
                auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),  # one client for every caller: no cookie may carry over
            )  # fmt: skip
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ decisions

    async def decide(self, features: RequestFeatures, *, retried: bool = False) -> Choice:
        """Admission, then the policy; OverloadedError or UnavailableError when nobody can take it.

        Queue mode holds a request that does not fit (:meth:`_hold`), and one that arrives while others are
        held: it waits its turn behind them, unless no wait could bring it within the objective.
        ``retried``: its turn came already (the replica chosen refused the connection): it goes first.
        """
        return (await self._decide(features, _Tries(), retried=retried))[0]

    async def _decide(self, features: RequestFeatures, tries: _Tries, *, retried: bool) -> tuple[Choice, float]:
        """:meth:`decide`, and the seconds the request was held at admission."""
        held_s = 0.0
        refusal = admission(features, self._states(features), self.config.cost)
        if self.config.admission == "queue" and (refusal is not None or self._behind_others(features)):
            held_s = await self._hold(features, tries, first=retried)
        elif refusal is not None:
            raise self._refused(refusal, ahead=0)
        states = self._states(features)
        choice = self.policy(features, states, self._turn)
        self._turn += 1
        if choice.replica is None:
            raise UnavailableError("no healthy replica")
        if choice.predicted_ttft_s is None:
            state = next(s for s in states if s.name == choice.replica)
            choice = replace(choice, predicted_ttft_s=predict(state, features, self.config.cost).ttft_s)
        return choice, held_s

    def _behind_others(self, features: RequestFeatures) -> bool:
        """Requests are held already, and this one would gain from waiting (over the objective alone it would not;
        judged with its cached prefix, as admission judges it)."""
        states = healthy(self._states(features))
        return bool(self.held) and not over_objective_alone(features, states, self.config.cost)

    async def _hold(self, features: RequestFeatures, tries: _Tries, *, first: bool) -> float:
        """Wait in line until, first in it, admission lets the request through (returns the seconds held);
        refused at ``max_queue_s`` from its first wait (a retry waits what is left of it), or at once with
        ``max_queued`` held.  Every wait, however it ends, is one ``moeslo_router_queue_wait_seconds``.

        The first in line looks again whenever a replica may take more (:class:`HeldRequests`), and at least
        every scrape interval; a request that leaves (admitted, refused, its client gone) wakes the next.
        Queue mode holds a request while no replica is healthy too (a fleet scaled to zero, or starting): the
        controller reads this queue as demand and starts one.
        """
        if not first and len(self.held) >= self.config.max_queued:
            raise self._refused(None, ahead=len(self.held))
        joined_s = self.clock()
        if tries.deadline_s is None:
            tries.deadline_s = joined_s + self.config.max_queue_s
        deadline = tries.deadline_s
        place = self.held.join(first=first)
        self.metrics.queued.inc()
        try:
            while True:
                refusal = None
                if self.held.is_first(place):
                    refusal = admission(features, self._states(features), self.config.cost)
                    if refusal is None:
                        return self.clock() - joined_s
                remaining_s = deadline - self.clock()
                if remaining_s <= 0:
                    refusal = refusal or admission(features, self._states(features), self.config.cost)
                    raise self._refused(refusal, ahead=self.held.ahead_of(place))
                wait_s = remaining_s
                if refusal is not None:
                    wait_s = min(refusal.retry_after_s or wait_s, self.config.scrape_interval_s, wait_s)
                await self.held.wait(place, wait_s)
        finally:
            self.held.leave(place)
            self.metrics.queued.dec()
            self.metrics.queue_wait.observe(self.clock() - joined_s)

    def _refused(self, refusal: Choice | None, *, ahead: int) -> MoesloError:
        """The refusal of a request nobody can take (None: it would fit, but ``ahead`` requests wait before it)."""
        if refusal is None:
            return OverloadedError(f"{ahead} earlier requests are still held before this one",
                                   retry_after_s=self.config.scrape_interval_s)  # fmt: skip
        if refusal.retry_after_s is None:
            return UnavailableError("no healthy replica")
        best_s = refusal.predicted_ttft_s or 0.0
        objective_s = best_s - refusal.retry_after_s  # this request's: the threshold plus its prompt's allowance
        return OverloadedError(f"every replica is predicted over this request's {objective_s:.3g} s TTFT objective "
                               f"(best {best_s:.3f} s)",
                               retry_after_s=refusal.retry_after_s)  # fmt: skip

    def _states(self, features: RequestFeatures) -> tuple[ReplicaState, ...]:
        """The replicas as the policies see them for this request (its cached prefix)."""
        return with_cached_tokens(self.pool.snapshot(), features, self.prefixes)

    def set_replicas(self, names: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """Make ``names`` the replica set (the controller added or removed replicas); returns (added, removed)."""
        added, removed = self.pool.set_members(names)
        self.prefixes.retain(self.pool.names)
        for name in added:
            self.metrics.add_replica(name)
            self.metrics.healthy[name].set(0)  # until its health checks pass
        for name in removed:
            self.metrics.remove_replica(name)
        return added, removed

    def eject(self, name: str, *, frozen: bool = False) -> None:
        """Take ``name`` out of routing; ``frozen`` (it answered none of its last scrapes): end the requests
        it has been as silent on too, with a 504 or a stream error event, instead of leaving them
        ``upstream_timeout_s``; those still receiving bytes go on."""
        self.prefixes.forget(name)  # a replica that failed may come back restarted, its cache empty
        if self.pool.eject(name):
            self.metrics.ejections[name].inc()
            self.metrics.healthy[name].set(0)
        if frozen:
            # A replica can be slow to render /metrics while its streams still flow: only the requests it
            # has been silent on for as long as it was on its scrapes are ended.
            cfg = self.config
            window_s = cfg.eject_after_silent * (cfg.scrape_interval_s + cfg.scrape_timeout_s)
            for task, exchange in list(self._in_flight.get(name, {}).items()):
                self._end_if_silent(name, task, exchange, window_s)

    def _end_if_silent(self, name: str, task: asyncio.Task[Any], exchange: _Exchange, window_s: float) -> None:
        """End a request its frozen replica ``name`` has said nothing on for ``window_s``; else look again when it
        would have (a stream that stops later ends then, not at ``upstream_timeout_s``)."""
        if self._in_flight.get(name, {}).get(task) is not exchange:
            return  # done, or moved on to another replica (a retry): not this replica's to end
        if self.pool.is_healthy(name):
            return  # readmitted: no longer frozen (a later freeze ejects it again and watches anew)
        quiet_s = self.clock() - exchange.heard_s
        if quiet_s >= window_s:
            exchange.abandoned = True
            task.cancel()
        else:
            asyncio.get_running_loop().call_later(window_s - quiet_s, self._end_if_silent, name, task, exchange,
                                                  window_s)  # fmt: skip

    # ------------------------------------------------------------------ completions

    async def completion(self, path: str, raw_headers: Iterable[tuple[bytes, bytes]], body: bytes,
                         send: Send) -> None:  # fmt: skip
        """POST /v1/completions or /v1/chat/completions (``path`` with its query string).

        The server cancels this when the client goes away (or a write to it raises
        :class:`~router.wire.ClientGone` first): either way the ``finally`` blocks close the
        upstream response, and the replica stays in.
        """
        started_s = self.clock()
        try:
            features = body_features(body, path, block_tokens=self.config.block_tokens,
                                     max_blocks=self.config.prefix_max_blocks)
        except ValidationError:  # answered 400 by the server; still one request, counted as it ends
            self.metrics.request(None, "none", INVALID_REQUEST_OUTCOME)
            raise
        exchange = _Exchange(send)
        try:
            await self._complete(path, upstream_headers(raw_headers), features, body, exchange, started_s)
        except ClientGone:
            if not exchange.answered:
                exchange.outcome = "client_disconnected"
        finally:
            self.metrics.request(exchange.replica, exchange.decision, exchange.outcome)

    async def _complete(self, path: str, headers: list[tuple[str, str]], features: RequestFeatures, body: bytes,
                        exchange: _Exchange, started_s: float) -> None:  # fmt: skip
        tries = _Tries()
        for tried in range(max(1, len(self.pool.names))):  # an empty set: decide() says no healthy replica
            try:
                choice, held_s = await self._decide(features, tries, retried=tried > 0)
            except MoesloError as exc:
                exchange.outcome = REJECTED_OUTCOME if isinstance(exc, OverloadedError) else "unavailable"
                exchange.decision = "all_over_budget" if isinstance(exc, OverloadedError) else "no_healthy_replica"
                await _send_error(exchange, exc)
                return
            exchange.replica, exchange.decision = choice.replica, choice.reason
            exchange.held_s += held_s
            if await self._attempt(choice, features, path, body, headers, exchange, started_s):
                return
        exchange.outcome = "unavailable"
        await _send_error(exchange, UnavailableError("every replica refused the connection, did not accept it in "
                                                     "time, or answered 503"))  # fmt: skip

    async def _attempt(self, choice: Choice, features: RequestFeatures, path: str, body: bytes,
                       headers: list[tuple[str, str]], exchange: _Exchange, started_s: float) -> bool:  # fmt: skip
        """One try on the chosen replica; False when nothing reached an engine there (try another)."""
        name = choice.replica
        assert name is not None
        cached = self.prefixes.cached_blocks(name, features.prefix_blocks) * features.block_tokens
        work = round(prefill_work(features, cached, self.config.cost))
        ticket = self.pool.begin(name, work, streamed=features.stream)
        self.prefixes.record(name, features.prefix_blocks)
        self.metrics.outstanding[name].inc()
        if choice.predicted_ttft_s is not None:
            self.metrics.predicted(name, choice.predicted_ttft_s)
        sent_s = self.clock()
        if not exchange.tried:  # once per request: a retry's time includes the failed try's
            exchange.tried = True
            self.metrics.overhead.observe(sent_s - started_s - exchange.held_s)
        task = asyncio.current_task()
        assert task is not None  # the server runs every request in a task of its own
        flights = self._in_flight.setdefault(name, {})
        flights[task] = exchange
        exchange.heard_s = sent_s
        try:
            return await self._exchange(name, path, body, headers, choice, ticket, exchange, sent_s)
        except asyncio.CancelledError:
            if not exchange.abandoned or task.uncancel() > 0:
                raise  # the client went away (the server cancels the request), not only the replica
            if not exchange.answered:  # a stream whose [DONE] is out was served: nothing to tell
                await self._answer_abandoned(name, exchange)
            return True
        finally:
            # The one place a request is counted out of its replica's load, however it ended: a client that
            # leaves before the replica's first byte cancels the post itself, and must not leave it busier.
            self._done(ticket)
            del flights[task]
            if not flights and self._in_flight.get(name) is flights:
                del self._in_flight[name]  # replicas come and go: no record of those with nothing in flight

    async def _answer_abandoned(self, name: str, exchange: _Exchange) -> None:
        error = UpstreamTimeoutError(f"replica {name} stopped answering (ejected after "
                                     f"{self.config.eject_after_silent} scrapes in a row without an answer)",
                                     replica=name)  # fmt: skip
        if not exchange.started:
            exchange.outcome = "upstream_error"
            await _send_error(exchange, error)
            return
        exchange.outcome = "upstream_failed_mid_stream"
        await exchange.send({"type": "http.response.body", "body": exchange.error_event(error), "more_body": False})

    async def _exchange(self, name: str, path: str, body: bytes, headers: list[tuple[str, str]], choice: Choice,
                        ticket: Ticket, exchange: _Exchange, sent_s: float) -> bool:  # fmt: skip
        """Send the request to ``name`` and relay its answer; False when nothing reached an engine there (the
        connection was refused or not accepted within ``connect_timeout_s``, or it answered 503: an engine
        whose core died does so before any work), so the replica leaves routing until its health checks pass
        and the next choice serves."""
        try:
            upstream = await self.session.post(name + path, data=body, headers=headers)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):  # refused, or never accepted
            upstream = None
        except UPSTREAM_FAILURES as exc:
            self.eject(name)
            exchange.outcome = "upstream_error"
            await _send_error(exchange, upstream_error(exc, name))
            return True
        if upstream is None or upstream.status == 503:
            if upstream is not None:
                upstream.close()
            self.eject(name)  # the failed try shows as the ejection; the request counts once, as it ends
            return False
        try:
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                await self._relay(upstream, ticket, choice, exchange, sent_s)
            else:
                await self._relay_whole(upstream, name, exchange)
        finally:
            if exchange.outcome in ("ok", "upstream_status"):
                upstream.release()
            else:
                upstream.close()  # the connection goes: the engine sees its client leave
        self._count_answer(name, exchange, max(upstream.status, exchange.errors.code or 0))
        return True

    def _count_answer(self, name: str, exchange: _Exchange, status: int) -> None:
        """Eject ``name`` after ``eject_after_5xx`` server errors in a row: one failing every request at once looks
        the least loaded of all, and the load-aware policies would send it most of the traffic."""
        if exchange.outcome == "upstream_error":  # the router's own 502 for an answer that is not what it claims
            failed = True
        elif exchange.outcome in ("ok", "upstream_status"):
            failed = status >= 500
        else:
            return  # a client gone says nothing of the replica; a stream broken mid-way ejected it already
        if self.pool.answered(name, failed=failed):
            _log.warning("replica %s answered %d requests in a row with a server error: ejected until it passes its "
                         "health checks", name, self.config.eject_after_5xx)  # fmt: skip
            self.eject(name)

    def _done(self, ticket: Ticket) -> None:
        # A replica removed and listed again since has a new gauge at 0: the ticket's count left with the old one.
        if self.pool.finish(ticket) and (gauge := self.metrics.outstanding.get(ticket.replica)) is not None:
            gauge.dec()

    async def _relay(self, upstream: aiohttp.ClientResponse, ticket: Ticket, choice: Choice, exchange: _Exchange,
                     sent_s: float) -> None:  # fmt: skip
        """Pass an SSE stream through chunk by chunk; a break ends it with an error event and ejects, unless it came
        after the ``[DONE]`` (the answer is whole: it ends as it would have)."""
        send = exchange.send
        await send({"type": "http.response.start", "status": upstream.status, "headers": _relayed(upstream)})
        exchange.started = True
        exchange.heard_s = self.clock()
        try:
            async for chunk in upstream.content.iter_any():
                exchange.heard_s = self.clock()
                if not ticket.started:
                    self.pool.first_token(ticket)
                    observed_s = self.clock() - sent_s
                    self.metrics.observed(ticket.replica, observed_s, choice.predicted_ttft_s)
                    if choice.predicted_ttft_s is not None:
                        self.pool.calibrate(ticket.replica, choice.predicted_ttft_s, observed_s)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                exchange.tail = (exchange.tail + chunk)[-len(SSE_DONE):]
                exchange.errors.scan(chunk)
                if exchange.tail == SSE_DONE:  # the whole answer is out: a client that leaves now was served
                    exchange.answered = True
                    exchange.outcome = exchange.errors.outcome(upstream.status)
        except UPSTREAM_FAILURES as exc:
            if exchange.answered:  # a break after [DONE] (no chunked terminator): the client has the whole answer
                upstream.close()  # the connection is not fit to reuse
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            self.eject(ticket.replica)
            exchange.outcome = "upstream_failed_mid_stream"
            error = exchange.error_event(upstream_error(exc, ticket.replica))
            await send({"type": "http.response.body", "body": error, "more_body": False})
            return
        exchange.outcome = exchange.errors.outcome(upstream.status)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_whole(self, upstream: aiohttp.ClientResponse, name: str, exchange: _Exchange) -> None:
        """Read a whole answer; relay it when it is the JSON it claims to be, else a 502 naming the replica."""
        try:
            content = await upstream.read()
        except UPSTREAM_FAILURES as exc:
            self.eject(name)
            exchange.outcome = "upstream_error"
            await _send_error(exchange, upstream_error(exc, name))
            return
        problem = _check_answer(upstream, content)
        if problem is not None:
            exchange.outcome = "upstream_error"
            await _send_error(exchange, UpstreamError(f"replica {name} answered {problem}", replica=name))
            return
        exchange.outcome = "ok" if upstream.status < 400 else "upstream_status"
        exchange.started = True
        await send_bytes(exchange.send, upstream.status, content, _relayed(upstream))


def _check_answer(upstream: aiohttp.ClientResponse, content: bytes) -> str | None:
    """What is wrong with a whole answer (None: relay it): JSON that does not parse, or a non-JSON server error.

    A 4xx goes back as written whatever its body: it speaks of the request (an auth sidecar's plain 401, the
    server's own 400 for headers too large), and as the router's 502 it counted toward ejecting the replica.
    """
    if 400 <= upstream.status < 500:
        return None
    is_json = "json" in upstream.headers.get("content-type", "")
    if is_json:
        try:
            json.loads(content)
        except (ValueError, UnicodeDecodeError):
            return f"HTTP {upstream.status} with a body that is not the JSON it claims"
        return None
    if upstream.status >= 500 or upstream.status < 200:
        return f"HTTP {upstream.status} without a JSON error document"
    return None


def _relayed(upstream: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    return relayed_headers(upstream.raw_headers)


async def _send_error(exchange: _Exchange, exc: MoesloError) -> None:
    if exchange.started:
        return
    status, body, headers = error_document(exc)
    exchange.started = True
    await send_json(exchange.send, status, body, headers)


__all__ = ["Router"]
