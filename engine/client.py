"""The API process's side of the engine: starts the engine-core process and talks to it.

:class:`EngineCoreClient` binds two ZeroMQ IPC sockets (requests out, outputs
and statistics in; :mod:`engine.wire`), starts ``python -m engine.core_proc``
and waits for its READY.  A receiver thread then reads every message of the
core: statistics go to the registered :class:`~engine.stats.StatsSink`
objects and the expert-load window first (:mod:`engine.stats_publisher`:
requests counted as their clients saw them), then each request's outputs to
its :class:`RequestStream` on the event loop that made it.  Nothing here runs a
model or imports torch, so nothing in the HTTP process can stall a step.
Nor does the core stall the HTTP process: sends never block
(:mod:`engine.core_inputs`); with the core's input queue full, a request or
call is refused with :class:`~contracts.errors.UnavailableError` (503) and an
abort waits to be sent.

Failure of the core is found by the receiver: the process has exited (checked
every 0.1 s), or it has said nothing for ``core_silence_timeout_s`` (it speaks
at least once a second, but not within a step: stopped, or hung in a step).
The receiver logs one line naming the exit status or the silence, fails every
request in flight with :class:`~contracts.errors.UnavailableError` and makes
:meth:`EngineCoreClient.health` report why.  A silent core is never trusted
again: what it says later is dropped, it is left running for a stack dump.
A core that is alive but broken (a dead EP rank, a failed step) says so at
once in a HEALTH message; either way the change is logged and handed to every
sink that has ``record_health(broken)`` (the Prometheus sink's
``moe_engine_healthy``), and the requests failed here to every sink that has
``record_failed(lost)`` (each as a :class:`~engine.stats.FinishedRequestStats`:
its tokens so far and its time since arrival).  An OpenAI request's choices
(:class:`~engine.request_stream.ChoiceGroup`) go to every sink that has
``record_request`` once all have ended, as one request.
The core, for its part, exits when this process dies.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import zmq

from contracts.errors import MoesloError, UnavailableError, ValidationError
from contracts.placement import Placement
from engine import wire
from engine.blocks_view import BlocksView
from engine.core_inputs import CoreInputs
from engine.core_launch import POLL_S, core_options, launch_core, wait_ready
from engine.engine_types import EngineConfig, ExpertLoad, RequestOutput
from engine.errors import PromptTooLongError
from engine.executors.options import ExecutorOptions
from engine.request_stream import ChoiceGroup, RequestStream, deliver
from engine.sampling import SamplingParams
from engine.stats import PlacementSwapStats, StatsSink, StepStats
from engine.stats_publisher import StatsPublisher

log = logging.getLogger("moeslo.engine_client")
QUEUE_FULL = "the engine core is not reading its input (its queue is full); try again later"


class EngineCoreClient:
    """Start, feed and watch one engine-core process."""

    def __init__(self, executor: ExecutorOptions, config: EngineConfig | None = None, *,
                 sinks: Iterable[StatsSink] = (), startup_timeout_s: float = 600.0) -> None:
        self.executor_options = executor
        self.config = config or EngineConfig()
        self._stats = StatsPublisher(sinks, self.config.routing_window_steps)
        self._startup_timeout_s = startup_timeout_s
        self._streams: dict[str, RequestStream] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._call_ids = itertools.count()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._dead: str | None = None
        self._hung = False
        self._ignored = 0  # messages of a hung core dropped (it spoke again)
        self._broken: str | None = None
        self._info: dict[str, Any] = {}
        self._final: dict[str, Any] = {}  # the core's state as it stopped (GOODBYE)
        self._ctx = zmq.Context()
        self._input_socket = self._ctx.socket(zmq.PUSH)
        self._inputs = CoreInputs(self._input_socket)
        self._outputs = self._ctx.socket(zmq.PULL)

    # ----------------------------------------------------------------- lifecycle

    def add_sink(self, sink: StatsSink) -> None:
        self._stats.sinks.append(sink)

    def start(self) -> EngineCoreClient:
        """Start the core and wait until its model is loaded; UnavailableError if it is not."""
        if self._proc is not None:
            return self
        # The sockets' folder is needed only until the core has connected (READY came on one socket, after it
        # connected the other).  Removed only in shutdown() or at exit, it was left behind by every API process
        # killed with SIGKILL (a stop's last resort after its bounded wait, the OOM killer).
        with tempfile.TemporaryDirectory(prefix="moeslo-core-") as tmp:
            in_addr, out_addr = (f"ipc://{Path(tmp) / name}" for name in ("in.sock", "out.sock"))
            self._input_socket.bind(in_addr)
            self._outputs.bind(out_addr)
            self._proc = launch_core(core_options(self.executor_options, self.config, in_addr, out_addr))
            atexit.register(self._kill)
            try:
                self._info = wait_ready(self._proc, self._outputs, self._startup_timeout_s)
            except BaseException:
                self._kill()
                raise
        self._thread = threading.Thread(target=self._receive_loop, name="moeslo-engine-client", daemon=True)
        self._thread.start()
        return self

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._closing and self._dead is None

    def health(self) -> str | None:
        """None when the engine can serve; else why not."""
        if self._dead is not None:
            return self._dead
        if not self.is_alive:
            return "the engine core is not running"
        return None if self._broken is None else f"executor broken: {self._broken}"

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the core (requests in flight finish with ``abort``) and wait for it to exit."""
        if self._closing:
            return
        self._closing = True
        if self._proc is not None and self._proc.poll() is None and self._hung:
            self._kill()  # it has not read its input for a long time: nothing to wait for
        elif self._proc is not None and self._proc.poll() is None:
            deadline = time.monotonic() + timeout_s
            self._inputs.send_until([wire.SHUTDOWN], deadline)  # never blocked by a core that stopped reading
            try:
                self._proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("engine core did not stop within %g s; killing it", timeout_s)
                self._kill()
        if self._thread is not None:
            self._thread.join(5)
        self._fail_all(UnavailableError("the engine shut down"), finish_reason="abort")
        self._input_socket.close(0)
        self._outputs.close(0)
        self._ctx.term()
        atexit.unregister(self._kill)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    # ----------------------------------------------------------------- what READY told

    @property
    def num_blocks(self) -> int:
        return int(self._info["num_blocks"])

    @property
    def blocks(self) -> BlocksView:
        return BlocksView(self.call, int(self._info["num_blocks"]), int(self._info["block_size"]))

    @property
    def max_model_len(self) -> int:
        return int(self._info["max_model_len"])

    @property
    def context_note(self) -> str | None:
        """Why the context is shorter than the checkpoint's (the KV cache caps it); None when it is not."""
        note = self._info.get("context_note")
        return None if note is None else str(note)

    @property
    def vocab_size(self) -> int:
        return int(self._info["vocab_size"])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The tokens that end a sequence, the tokenizer's first (:func:`engine.generation_config.eos_token_ids`)."""
        return tuple(int(t) for t in self._info.get("eos_token_ids", ()))

    @property
    def num_experts(self) -> int:
        return int(self._info["num_experts"])

    @property
    def warmup_steps(self) -> int:
        """Model steps the core ran to warm up before it said ready (0: no warm-up)."""
        return int(self._info.get("warmup_steps", 0))

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def pending_aborts(self) -> int:
        """Aborts waiting for room in the core's input queue (:mod:`engine.core_inputs`)."""
        return self._inputs.pending_aborts

    @property
    def placement(self) -> Placement:
        return Placement.from_json(self._info["placement"])

    # ----------------------------------------------------------------- requests

    def check_prompt_ids(self, prompt_token_ids: Iterable[int]) -> None:
        """Token ids outside the vocabulary are a 400 (before anything decodes them: the tokenizer overflows)."""
        vocab = self.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")

    def check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """What can be refused here without asking the core (it checks again)."""
        self.check_prompt_ids(prompt_token_ids)
        vocab = self.vocab_size
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"stop_token_ids must be in [0, {vocab}); got {bad[:5]}")
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"logit_bias: token ids must be in [0, {vocab}); got {bad[:5]}")
        if not prompt_token_ids:
            raise ValidationError("prompt must have at least one token")
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise PromptTooLongError(prompt_tokens=len(prompt_token_ids), max_tokens=params.max_tokens,
                                     max_model_len=self.max_model_len, context_note=self.context_note)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str | None = None,
                    arrival_s: float | None = None, group: ChoiceGroup | None = None, choice: int = 0,
                    checks_stops: bool = False) -> RequestStream:  # fmt: skip
        """Send a request to the core; its outputs (or its rejection) arrive on the returned stream.

        Call on the event loop that will read the stream.  ``group``: the OpenAI request it is choice ``choice``
        of (once every choice has ended, that request goes to each sink that has ``record_request``).
        ``checks_stops``: its reader looks for stop strings, and says how the request ended for its client
        (:meth:`RequestStream.settle`, :meth:`RequestStream.stop_reading`); its statistics wait for that.
        """
        self._raise_if_down()
        self.check_prompt(prompt_token_ids, params)
        request_id = request_id or f"cmpl-{uuid.uuid4().hex}"
        arrival = time.monotonic() if arrival_s is None else arrival_s
        stream = RequestStream(request_id, asyncio.get_running_loop(), arrival_s=arrival,
                               prompt_tokens=len(prompt_token_ids), group=group, choice=choice,
                               on_seen=self._stats.record_seen if checks_stops else None)  # fmt: skip
        stream.join(lambda request: self._to_sinks("record_request", request))  # before anything can end it
        with self._lock:  # _dead: failed since the check above, and _fail_all would never reach this stream
            if self._dead is not None or request_id in self._streams:
                stream.refused()
                raise UnavailableError(self._dead) if self._dead is not None else ValidationError(
                    f"request_id {request_id!r} is already in flight")
            self._streams[request_id] = stream
        if not self._inputs.send([wire.ADD, request_id, list(prompt_token_ids), wire.params_to_wire(params),
                                  arrival]):
            with self._lock:
                self._streams.pop(request_id, None)
            stream.refused()
            raise UnavailableError(QUEUE_FULL)
        return stream

    def abort(self, request_id: str | None = None, reason: str = "abort") -> int:
        """End a request in the core (its KV blocks are freed before the next step), or every one in flight (None: a
        server's shutdown that waited long enough); their final outputs follow.  The number ended."""
        with self._lock:
            request_ids = list(self._streams) if request_id is None else [request_id]
        if request_ids and self.is_alive:
            self._inputs.abort(request_ids, reason)
        return len(request_ids)

    # ----------------------------------------------------------------- utility calls

    def call(self, method: str, *args: Any, timeout_s: float = 300.0,
             on_reply: Callable[[Future[Any]], object] | None = None) -> Any:
        """Run ``method`` in the core between two steps and return its result (blocking); ``on_reply`` gets the
        core's answer whenever it comes, after ``timeout_s`` too."""
        self._raise_if_down()
        call_id = next(self._call_ids)
        future: Future[Any] = Future()
        with self._lock:
            self._calls[call_id] = future
        if not self._inputs.send([wire.CALL, call_id, method, list(args)]):
            with self._lock:
                self._calls.pop(call_id, None)
            raise UnavailableError(QUEUE_FULL)
        if on_reply is not None:
            future.add_done_callback(on_reply)
        return future.result(timeout_s)

    def request_placement(self, placement: Placement, timeout_s: float = 300.0) -> PlacementSwapStats:
        """Apply ``placement`` between two steps; PlacementError (old placement kept) propagates.  Past ``timeout_s``
        it stays queued (UnavailableError: it may still be applied): the placement served follows the core's answer."""
        raw = placement.to_json()

        def took(reply: Future[Any]) -> None:  # in the receiver thread, in the order the core applied them
            if not reply.cancelled() and reply.exception() is None:
                self._info["placement"] = raw

        try:
            duration_s, moved, moved_bytes = self.call("apply_placement", raw, timeout_s=timeout_s, on_reply=took)
        except TimeoutError as exc:
            raise UnavailableError(f"the placement apply timed out after {timeout_s:g} s; it may still be applied "
                                   "(GET /v1/placement shows the placement in use)") from exc  # fmt: skip
        return PlacementSwapStats(duration_s=duration_s, experts_moved=moved, bytes_moved=moved_bytes)

    def expert_load(self) -> ExpertLoad | None:
        return self._stats.load.snapshot()

    def kv_state(self) -> tuple[int, int]:
        """(blocks used, blocks total); after shutdown, as the core left them."""
        used, total = self._final["kv_state"] if self._closing and self._final else self.call("kv_state")
        return int(used), int(total)

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting); after shutdown, as the core left them."""
        running, waiting = self._final["num_requests"] if self._closing and self._final else self.call("num_requests")
        return int(running), int(waiting)

    def set_step_delay(self, delay_s: float) -> None:
        """Fault injection for tests and drills: every model step takes ``delay_s`` longer."""
        self.call("set_step_delay", delay_s)

    def fail_next_step(self) -> None:
        """Fault injection for tests and drills: the core's next step raises, which breaks the engine."""
        self.call("fail_next_step")

    def _raise_if_down(self) -> None:
        reason = self.health()
        if reason is not None:
            raise UnavailableError(reason)

    # ----------------------------------------------------------------- the receiver thread

    def _receive_loop(self) -> None:
        assert self._proc is not None
        silent_s = 0.0
        while True:
            began = time.monotonic()
            if self._outputs.poll(int(POLL_S * 1000)):
                silent_s = 0.0
                try:
                    self._handle(wire.unpack(self._outputs.recv()))
                except Exception:  # one bad message must not stop the receiver
                    log.exception("engine client: could not handle a message from the core")
                continue
            # Only the time spent waiting counts: a stall of this process (stopped, starved of CPU) is
            # not the core's silence.
            silent_s += min(time.monotonic() - began, 2 * POLL_S)
            if self._inputs.pending_aborts:
                self._inputs.flush()
            if self._proc.poll() is not None:
                if not self._closing and not self._hung:
                    self._on_core_exit(self._proc.returncode)
                return
            if silent_s >= self.config.core_silence_timeout_s and self._dead is None and not self._closing:
                self._on_core_silent()

    def _handle(self, msg: list[Any]) -> None:
        kind = msg[0]
        if self._hung:
            self._ignored += 1
            if self._ignored == 1:
                log.warning("engine core: it speaks again after its silence; it stays failed until a restart")
            return
        if kind == wire.STEP:
            outputs = [wire.output_from_wire(raw) for raw in msg[1]]
            if msg[2] is not None:
                self._record(wire.stats_from_wire(msg[2]), outputs)
            self._dispatch(outputs)
        elif kind == wire.REJECT:
            self._reject(msg[1], wire.error_from_wire(msg[2]))
        elif kind == wire.REPLY:
            self._reply(msg[1], msg[2], msg[3])
        elif kind == wire.HEALTH:
            self._set_broken(msg[1])
        elif kind == wire.GOODBYE:
            self._final = msg[1]

    def _record(self, stats: StepStats, outputs: list[RequestOutput]) -> None:
        with self._lock:  # the streams of its outputs and finished requests (the choices they may be)
            ids = {out.request_id for out in outputs} | {fin.request_id for fin in stats.finished}
            streams = {rid: stream for rid in ids if (stream := self._streams.get(rid)) is not None}
        self._stats.record_step(stats, streams, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Hand outputs to their streams: one wake-up per event loop, not one per output."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput | MoesloError]]] = {}
        with self._lock:
            for out in outputs:
                stream = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
                if out.finished:
                    self._inputs.forget(out.request_id)
                if stream is not None:
                    stream.generated += out.token_id is not None
                    batches.setdefault(stream.loop, []).append((stream, out))
        for loop, batch in batches.items():
            deliver(loop, batch)

    def _reject(self, request_id: str, error: MoesloError) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.refused()
            deliver(stream.loop, [(stream, error)])

    def _reply(self, call_id: int, ok: bool, value: Any) -> None:
        with self._lock:
            future = self._calls.pop(call_id, None)
        if future is None:
            return
        if ok:
            future.set_result(value)
        elif value.get("type") == "AssertionError":
            future.set_exception(AssertionError(value.get("message")))
        else:
            future.set_exception(wire.error_from_wire(value))

    def _set_broken(self, reason: str | None) -> None:
        if reason == self._broken:
            return
        self._broken = reason
        if reason is not None:
            log.error("engine broken: %s; /health answers 503 until the supervisor restarts the replica", reason)
        self._record_health(self.health())

    def _record_health(self, broken: str | None) -> None:
        self._to_sinks("record_health", broken)

    def _to_sinks(self, method: str, *args: object) -> None:
        self._stats.to_sinks(method, *args)

    def _on_core_exit(self, status: int | None) -> None:
        if status == -signal.SIGTERM:
            # A stop from outside (a whole process group or cgroup stopped at once): say so, not "died".
            self._dead = "the engine core process was stopped by SIGTERM"
            log.log(logging.INFO if self._closing else logging.ERROR,
                    "engine core stopped: %s; failing every request in flight, /health answers 503", self._dead)
        else:
            self._dead = f"the engine core process exited with status {status}"
            log.error("engine core died: %s; failing every request in flight, /health answers 503", self._dead)
        self._record_health(self._dead)
        self._inputs.clear()
        self._fail_all(UnavailableError(self._dead), finish_reason="error")

    def _on_core_silent(self) -> None:
        assert self._proc is not None
        self._dead = (f"the engine core has not answered for {self.config.core_silence_timeout_s:g} s "
                      "(stopped, or hung in a step)")
        self._hung = True
        log.error("engine core hung: %s; failing every request in flight, /health answers 503 until the replica "
                  "restarts (pid %d left as it is, for a stack dump)", self._dead, self._proc.pid)
        self._record_health(self._dead)
        with self._lock:
            in_flight = list(self._streams)
        if in_flight:  # should it ever read again, it drops them (sent when its queue has room)
            self._inputs.abort(in_flight, "error")
        self._fail_all(UnavailableError(self._dead), finish_reason="error")

    def _fail_all(self, error: MoesloError, *, finish_reason: str) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
            calls, self._calls = list(self._calls.values()), {}
        for future in calls:
            future.set_exception(error)
        if streams:  # the core reports the requests it finishes; these it never will
            now = time.monotonic()
            self._to_sinks("record_failed", [stream.lost(finish_reason, now) for stream in streams])
        batches: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput | MoesloError]]] = {}
        for stream in streams:
            final = RequestOutput(stream.request_id, None, finished=True, finish_reason=finish_reason,
                                  error=str(error))
            batches.setdefault(stream.loop, []).append((stream, final))
        for loop, batch in batches.items():
            deliver(loop, batch)


__all__ = ["BlocksView", "EngineCoreClient"]
