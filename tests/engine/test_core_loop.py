"""The engine-core process's loop (:class:`~engine.core_proc.CoreLoop`) on in-process sockets, and what a step
that raises leaves behind, on the fake executor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import zmq

from contracts.placement import Placement
from engine import wire
from engine.core import EngineCore
from engine.core_proc import CoreLoop
from engine.engine_types import EngineConfig, RequestOutput
from engine.sampling import SamplingParams
from tests.engine.fake_executor import FakeExecutor

LONG = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)


class LoopOnThread:
    """``core``'s loop on a thread, on in-process sockets; ``before_start`` is queued before it runs (its
    first drain reads them all)."""

    def __init__(self, core: EngineCore, before_start: list[list[Any]]) -> None:
        self._ctx = zmq.Context()
        core_in, self._to_core = self._ctx.socket(zmq.PULL), self._ctx.socket(zmq.PUSH)
        core_in.bind("inproc://core-in")
        self._to_core.connect("inproc://core-in")
        core_out, self._from_core = self._ctx.socket(zmq.PUSH), self._ctx.socket(zmq.PULL)
        self._from_core.bind("inproc://core-out")
        core_out.connect("inproc://core-out")
        self._sockets = (core_in, self._to_core, core_out, self._from_core)
        for msg in before_start:
            self.send(msg)
        self.loop = CoreLoop(core, core_in, core_out, lambda: True)
        self._thread = threading.Thread(target=self.loop.run, daemon=True)
        self._thread.start()
        self.received: list[list[Any]] = []

    def send(self, msg: list[Any]) -> None:
        self._to_core.send(wire.pack(msg))

    def receive(self, until: Callable[[list[list[Any]]], bool], timeout_s: float = 5.0) -> None:
        """Read what the loop sends until ``until(everything received)`` holds (AssertionError at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while not until(self.received):
            assert time.monotonic() < deadline, f"the loop did not send what was awaited: {self.received}"
            if self._from_core.poll(50):
                self.received.append(wire.unpack(self._from_core.recv()))

    def stop(self) -> None:
        """SHUTDOWN, then everything the loop sent until it ended."""
        self.send([wire.SHUTDOWN])
        self._thread.join(10)
        assert not self._thread.is_alive()
        self.receive(lambda got: bool(got) and got[-1][0] == wire.GOODBYE)
        for sock in self._sockets:
            sock.close(0)
        self._ctx.term()


@contextmanager
def core_loop(core: EngineCore, before_start: list[list[Any]]) -> Iterator[LoopOnThread]:
    loop = LoopOnThread(core, before_start)
    try:
        yield loop
    finally:
        loop.stop()


def health(received: list[list[Any]]) -> list[str | None]:
    return [msg[1] for msg in received if msg[0] == wire.HEALTH]


def finals(received: list[list[Any]]) -> list[tuple[str, str | None]]:
    """(request id, finish reason) of every final output the loop sent, in order."""
    outputs = [wire.output_from_wire(raw) for msg in received if msg[0] == wire.STEP for raw in msg[1]]
    return [(out.request_id, out.finish_reason) for out in outputs if out.finished]


def add(request_id: str) -> list[Any]:
    return [wire.ADD, request_id, [1, 2, 3], wire.params_to_wire(LONG), 0.0]


def test_a_step_that_raises_puts_back_the_final_outputs_it_took() -> None:
    """A request aborted just before a step that raised never got its final output: the step had taken it."""
    core = EngineCore(FakeExecutor(), EngineConfig())
    core.add_request("a", [1, 2, 3], LONG)
    core.add_request("b", [1, 2, 3], LONG)
    core.step()
    core.abort("a", "stop")
    core.fail_next_step = True
    with pytest.raises(RuntimeError, match="injected"):
        core.step()
    outputs: list[RequestOutput] = core.abort_all("error")
    assert [(o.request_id, o.finish_reason) for o in outputs if o.finished] == [("a", "stop"), ("b", "error")]


def test_a_request_stopped_in_the_drain_before_a_failing_step_still_ends_once() -> None:
    """The API found a stop string in A while a drill broke the next step: A's response hung (the step took
    and dropped its final output); now A ends with ``stop`` and B with ``error``, each exactly once."""
    core = EngineCore(FakeExecutor(), EngineConfig())
    queued = [add("a"), add("b"), [wire.CALL, 1, "fail_next_step", []], [wire.ABORT, ["a"], "stop"]]
    with core_loop(core, queued) as loop:
        loop.receive(lambda got: len(finals(got)) >= 2)
    assert finals(loop.received) == [("a", "stop"), ("b", "error")]
    assert health(loop.received) == ["an engine step failed"]


def test_requests_in_flight_at_shutdown_get_their_final_output() -> None:
    """The loop's SHUTDOWN aborted them but sent only their stats: the final outputs were taken and dropped."""
    core = EngineCore(FakeExecutor(step_delay_s=0.01), EngineConfig())
    with core_loop(core, [add("a")]) as loop:
        loop.receive(lambda got: any(msg[0] == wire.STEP for msg in got))
    assert finals(loop.received) == [("a", "abort")]


def _rolled_placement() -> dict[str, Any]:
    contiguous = Placement.contiguous(2, 4, 1)
    return Placement(phy2log=np.roll(contiguous.phy2log, 1, axis=1), num_ranks=1).to_json()


def test_a_broken_loop_sends_what_happens_after_and_goes_idle() -> None:
    """A broken core (a step raised) that then applied a placement spun at 100% CPU: its news was never sent, and
    the loop polled without waiting.  The swap's stats go out and the loop waits on its socket again."""
    core = EngineCore(FakeExecutor(), EngineConfig())
    with core_loop(core, [add("a"), [wire.CALL, 1, "fail_next_step", []]]) as loop:
        loop.receive(lambda got: finals(got) == [("a", "error")])
        loop.send([wire.CALL, 2, "apply_placement", [_rolled_placement()]])
        loop.receive(lambda got: any(msg[0] == wire.STEP and msg[2] is not None and "placement_swap" in msg[2]
                                     for msg in got))
        assert health(loop.received) == ["an engine step failed"]
        assert not core.has_news() and not core.has_work()  # nothing left to send: the loop waits on its socket
