"""The engine-core process: scheduler, KV cache and executor, behind two ZeroMQ sockets.

Started by :class:`engine.client.EngineCoreClient` as ``python -m
engine.core_proc`` with its :class:`CoreOptions` as JSON on stdin.  It
connects to the API process's two IPC sockets (requests in, outputs and
statistics out; :mod:`engine.wire` has the messages), loads the model, warms
it up (a few requests nobody sees, as vLLM warms up before it serves), says
READY and runs :class:`CoreLoop`: drain the input socket, run one step, send
its outputs and stats, and while idle block on the socket.  It says HEALTH
at least every second, idle or busy (between two steps: a step is never
interrupted), so the API process can tell a core that stopped or hung
(``EngineConfig.core_silence_timeout_s`` of silence) from a busy one.  EP
ranks (``--ep N``) are this process's children.

Health is checked on every turn of the loop, idle or busy (at least every
:data:`HEALTH_CHECK_S`): a dead EP rank or a step that raised marks the
engine broken.  The loop then logs why, fails every request in flight, sends
HEALTH at once and refuses new requests (503); it never runs another step.
Restarting the replica is its supervisor's job (the local actuator, or
Kubernetes through the failing ``/health`` probe).

It exits when asked (SHUTDOWN), when the API process dies (parent-death
signal, and a parent-pid check every second), or on SIGTERM.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import zmq

from contracts.errors import MoesloError, UnavailableError
from contracts.lifetime import die_with_parent
from contracts.placement import Placement
from engine import wire
from engine.core import EngineCore, StepResult
from engine.engine_types import EngineConfig
from engine.executors import ExecutorOptions, create_executor
from engine.generation_config import eos_token_ids
from engine.scheduler import SchedulerConfig

log = logging.getLogger("moeslo.engine_core")
HEARTBEAT_S = 1.0
"""Longest gap between two messages to the API process, except within a step."""
HEALTH_CHECK_S = 0.2
"""Longest wait between two health checks while idle (a dead rank shows in /health within ~0.3 s)."""
UNAVAILABLE = "the engine is unavailable"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreOptions:
    """What the engine-core process needs; crosses the process boundary as JSON."""

    executor: ExecutorOptions
    engine: EngineConfig
    input_address: str
    output_address: str
    parent_pid: int
    die_with_parent: bool = True
    log_level: str = "WARNING"

    def to_json(self) -> str:
        ex = self.executor
        executor = {k: v for k, v in asdict(ex).items() if k != "placement"}
        executor["checkpoint"] = str(ex.checkpoint)
        executor["placement"] = None if ex.placement is None else ex.placement.to_json()
        engine = {k: v for k, v in asdict(self.engine).items() if k != "scheduler"}
        engine["scheduler"] = asdict(self.engine.scheduler)
        return json.dumps({"executor": executor, "engine": engine, "input_address": self.input_address,
                           "output_address": self.output_address, "parent_pid": self.parent_pid,
                           "die_with_parent": self.die_with_parent, "log_level": self.log_level})

    @classmethod
    def from_json(cls, text: str) -> CoreOptions:
        raw = json.loads(text)
        ex = dict(raw["executor"])
        ex["checkpoint"] = Path(ex["checkpoint"])
        ex["placement"] = None if ex["placement"] is None else Placement.from_json(ex["placement"])
        engine = dict(raw["engine"])
        engine["scheduler"] = SchedulerConfig(**engine["scheduler"])
        return cls(executor=ExecutorOptions(**ex), engine=EngineConfig(**engine),
                   input_address=raw["input_address"], output_address=raw["output_address"],
                   parent_pid=int(raw["parent_pid"]), die_with_parent=bool(raw["die_with_parent"]),
                   log_level=str(raw["log_level"]))


class CoreLoop:
    """Busy loop of the engine core: inputs between steps, one message out per step."""

    def __init__(self, core: EngineCore, inputs: zmq.Socket[bytes], outputs: zmq.Socket[bytes],
                 parent_alive: Callable[[], bool]) -> None:
        self.core = core
        self.inputs = inputs
        self.outputs = outputs
        self._parent_alive = parent_alive
        self._running = True
        self._broken: str | None = None
        """Why a step raised (the executor reports its own failures in ``executor.broken``)."""
        self._reported: str | None = None
        self._calls: dict[str, Callable[..., Any]] = {
            "get_placement": self._placement_json,
            "apply_placement": self._apply_placement,
            "kv_state": lambda: list(core.kv_state()),
            "num_requests": lambda: list(core.num_requests()),
            "check_invariants": core.blocks.check_invariants,
            "set_routing_stats": core.executor.set_routing_stats,
            "set_step_delay": self._set_step_delay,
            "fail_next_step": self._fail_next_step,
            "broken": lambda: core.executor.broken,
        }

    def _placement_json(self) -> dict[str, Any]:
        return self.core.placement.to_json()

    def _apply_placement(self, raw: dict[str, Any]) -> list[Any]:
        swap = self.core.apply_placement(Placement.from_json(raw))
        return [swap.duration_s, swap.experts_moved, swap.bytes_moved]

    def _set_step_delay(self, delay_s: float) -> None:
        self.core.step_delay_s = float(delay_s)

    def _fail_next_step(self) -> None:
        self.core.fail_next_step = True

    def run(self) -> None:
        last_check = last_beat = time.monotonic()
        while self._running:
            busy = self._busy()
            if self.inputs.poll(0 if busy else int(HEALTH_CHECK_S * 1000)):
                self._drain()
            broken = self._check_health()
            if broken is None and self._busy():
                self._step()
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_S:  # busy or idle: the API process judges a silent core hung
                last_beat = now
                self._send([wire.HEALTH, self._reported])  # as last reported: a step may have broken it since
            if now - last_check >= HEARTBEAT_S:
                last_check = now
                if not self._parent_alive():
                    log.error("engine core: the API process is gone; exiting")
                    return
        self._end_all("abort")
        self._send([wire.GOODBYE, {"kv_state": list(self.core.kv_state()),
                                   "num_requests": list(self.core.num_requests())}])

    def _busy(self) -> bool:
        return self.core.has_work() or self.core.has_news()

    def _check_health(self) -> str | None:
        """Why the engine cannot serve (None: it can); a broken engine fails every request it still holds.

        It also sends what happened since (a placement swap, outputs a failed step put back): it runs no step
        that would, and the loop polls without waiting while the core has news.
        """
        broken = self._report()
        if broken is not None and (self.core.has_work() or self.core.has_news()):
            self._end_all("error", error=UNAVAILABLE)
        return broken

    def _end_all(self, reason: str, error: str | None = None) -> None:
        """End every request still held, and send their final outputs and stats."""
        aborted = self.core.abort_all(reason, error=error)
        result = self.core.flush()
        result.outputs[:0] = aborted
        self._publish(result)

    def _report(self) -> str | None:
        """On a change of health, log it and tell the API process at once (before any output it explains)."""
        broken = self._broken or self.core.executor.broken
        if broken != self._reported:
            self._reported = broken
            log.error("engine core: broken (%s); every request fails with 503 until a restart", broken)
            self._send([wire.HEALTH, broken])
        return broken

    def _step(self) -> None:
        try:
            result = self.core.step()
        except Exception:  # a failure no request can be blamed for: the engine is broken, the loop goes on
            log.exception("engine core: a step failed")
            self._broken = "an engine step failed"
            return
        self._report()  # a step the executor failed: the 503 reason reaches the API before the failed outputs
        self._publish(result)

    def _publish(self, result: StepResult) -> None:
        if result.outputs or result.stats is not None:
            stats = None if result.stats is None else wire.stats_to_wire(result.stats)
            self._send([wire.STEP, [wire.output_to_wire(o) for o in result.outputs], stats])

    def _drain(self) -> None:
        while self._running:
            try:
                data = self.inputs.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(wire.unpack(data))

    def _handle(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind == wire.ADD:
            _, request_id, prompt, params, arrival_s = msg
            try:
                if self._reported is not None:
                    raise UnavailableError(f"{UNAVAILABLE}: {self._reported}")
                self.core.add_request(request_id, prompt, wire.params_from_wire(params), arrival_s=arrival_s)
            except MoesloError as exc:
                self._send([wire.REJECT, request_id, wire.error_to_wire(exc)])
        elif kind == wire.ABORT:
            for request_id in msg[1]:
                self.core.abort(request_id, msg[2])
        elif kind == wire.CALL:
            self._call(msg[1], msg[2], msg[3])
        elif kind == wire.SHUTDOWN:
            self._running = False
        else:
            log.error("engine core: unknown message kind %r", kind)

    def _call(self, call_id: int, method: str, args: list[Any]) -> None:
        fn = self._calls.get(method)
        # Aborts handled in this same drain publish their outputs and stats first: a caller that reads
        # state after its reply (KV blocks free, no request running) finds the metrics already agree.
        self._publish(self.core.flush())
        try:
            if fn is None:
                raise MoesloError(f"unknown engine call {method!r}")
            self._send([wire.REPLY, call_id, True, fn(*args)])
        except Exception as exc:  # the caller gets the error; the loop goes on
            self._send([wire.REPLY, call_id, False, wire.error_to_wire(exc)])

    def _send(self, msg: list[Any]) -> None:
        self.outputs.send(wire.pack(msg))


def _ready_info(core: EngineCore) -> dict[str, Any]:
    cfg = core.executor.config
    return {"pid": os.getpid(), "num_blocks": core.blocks.num_blocks, "block_size": core.blocks.block_size,
            "max_model_len": core.max_model_len, "context_note": core.context_note, "vocab_size": cfg.vocab_size,
            "num_experts": cfg.num_experts, "num_ranks": core.executor.num_ranks, "placement": core.placement.to_json(),
            "eos_token_ids": list(core.eos_token_ids)}


def serve(options: CoreOptions) -> int:
    """Run the engine core until told to stop; the exit status."""
    if options.die_with_parent:
        die_with_parent()
    ctx = zmq.Context()
    inputs, outputs = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.LINGER, 2000)
    inputs.connect(options.input_address)
    outputs.connect(options.output_address)
    try:
        try:
            executor = create_executor(options.executor)
            core = EngineCore(executor, options.engine, eos_token_ids=eos_token_ids(options.executor.checkpoint))
            warmup_steps = 0
            if options.engine.warmup_requests:
                began = time.monotonic()
                warmup_steps = core.warm_up(options.engine.warmup_requests)
                log.info("engine core: warmed up with %d requests in %d steps, %.2f s",
                         options.engine.warmup_requests, warmup_steps, time.monotonic() - began)
        except MoesloError as exc:
            # Bad input (a missing checkpoint, a budget too small): the API process prints the message.
            log.info("engine core: the model did not load: %s", exc)
            outputs.send(wire.pack([wire.READY, {"error": wire.error_to_wire(exc)}]))
            return 1
        except Exception as exc:
            log.exception("engine core: the model did not load or warm up")
            outputs.send(wire.pack([wire.READY, {"error": wire.error_to_wire(exc)}]))
            return 1
        # What start-up allocated lives as long as the process: out of the collector's sight, a full
        # collection never walks it mid-step (as vLLM's engine core does after its start-up).
        gc.collect()
        gc.freeze()
        try:
            outputs.send(wire.pack([wire.READY, {**_ready_info(core), "warmup_steps": warmup_steps}]))
            CoreLoop(core, inputs, outputs, lambda: os.getppid() == options.parent_pid).run()
        finally:
            executor.shutdown()
        return 0
    finally:
        inputs.close(0)
        outputs.close()
        ctx.term()


def main() -> None:
    # Ctrl-C reaches the whole foreground process group; the API process owns the shutdown and stops
    # this one, so the core does not die mid-step (or mid-load) with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    options = CoreOptions.from_json(sys.stdin.read())
    logging.basicConfig(level=options.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(serve(options))


if __name__ == "__main__":
    main()


__all__ = ["CoreLoop", "CoreOptions", "die_with_parent", "main", "serve"]
