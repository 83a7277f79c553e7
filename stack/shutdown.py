"""The end of ``moeslo up``: nothing it started, or its controller started, outlives it.

* :func:`stop_on_sigterm`: SIGTERM ends a run as Ctrl-C does (:class:`Interrupted` is Ctrl-C's, raised
  once the processes are stopped); :func:`run_cancelled_on_sigterm`: during the load, SIGTERM cancels it as
  asyncio's Ctrl-C does, so its ``finally`` counts the requests in flight and ends its tasks in order.
* :func:`signals_deferred`: SIGINT and SIGTERM are noted, not acted on, while the stack stops (a second
  Ctrl-C cut the stop short and left Prometheus and Alertmanager running).
* :func:`stop_processes`: SIGTERM to every process at once, one shared deadline, then SIGKILL to the
  process group of each still running, and the ones still not gone named.
* :class:`ReplicaRecord`: the processes the controller started (its replicas run in sessions of their
  own), recorded while it runs, so any left when the stack stops -- after a controller that died, or was
  killed before it stopped them -- are stopped by their process groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import psutil

from contracts.lifetime import group_runs

__all__ = [
    "KILL_WAIT_S", "Interrupted", "ReplicaRecord", "run_cancelled_on_sigterm", "signals_deferred", "stop_on_sigterm",
    "stop_processes",
]

T = TypeVar("T")

KILL_WAIT_S = 5.0
"""How long a process may take to go after SIGKILL before it is reported as still running."""
_POLL_S = 0.05


class Interrupted(KeyboardInterrupt):
    """Ctrl-C ended the run, and its processes were stopped: ``still_running`` names any the stop could not end."""

    def __init__(self, still_running: list[str]) -> None:
        super().__init__()
        self.still_running = still_running


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_on_sigterm() -> Any:
    """SIGTERM (``kill``, a CI timeout) ends the run as Ctrl-C does: ``run_stack`` stops every process it
    started, where the default action would leave the engines, controller and Prometheus running; the
    previous handler is returned, to be put back."""
    if threading.current_thread() is not threading.main_thread():
        return None  # only the main thread may set handlers (a run inside a test's thread keeps the default)
    return signal.signal(signal.SIGTERM, _terminated)


def run_cancelled_on_sigterm(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where a SIGTERM cancels ``main`` as asyncio's Ctrl-C does, then raises
    ``SystemExit(128 + SIGTERM)`` once it has ended; a second SIGTERM raises at once (as a second Ctrl-C does).

    :func:`stop_on_sigterm`'s handler raised in the middle of the loop: asyncio then cancelled every task at once,
    and ``main``'s ``finally`` found its requests in flight already gone and its own awaits cancelled.  Off the main
    thread (where handlers cannot be set) it is ``asyncio.run``."""
    terminated: list[int] = []

    async def cancelled_on_sigterm() -> T:
        task = asyncio.current_task()
        if threading.current_thread() is not threading.main_thread() or task is None:
            return await main
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm() -> None:
            if terminated:
                _terminated(signal.SIGTERM, None)
            terminated.append(signal.SIGTERM)
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)  # which sets the default action: the caller's comes back
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    try:
        result = asyncio.run(cancelled_on_sigterm())
    except asyncio.CancelledError:
        if terminated:
            raise SystemExit(128 + signal.SIGTERM) from None
        raise
    if terminated:  # the load ended as the signal came: the run is stopped all the same
        raise SystemExit(128 + signal.SIGTERM)
    return result


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Inside, SIGINT and SIGTERM only append their number to the list yielded; the handlers come back after.

    Off the main thread (where handlers cannot be set) nothing changes."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the process group ``pid`` leads (to ``pid`` alone when it leads none, or leads ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return
        if group == pid and group != os.getpgid(0):
            os.killpg(group, sig)
        else:
            os.kill(pid, sig)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float = 15.0) -> list[int]:
    """SIGTERM to each, wait for all until ``timeout_s``, SIGKILL each one's group; the pids still running.

    A process that led a group of its own and has exited counts while its group has a live member: its
    children (a vLLM engine core) used to be left running, unreported."""
    running = [p for p in processes if _runs(p)]
    for process in running:
        _signal(process, signal.SIGTERM)
    running = _wait_all(running, timeout_s)
    for process in running:
        _signal(process, signal.SIGKILL)
    return [p.pid for p in _wait_all(running, KILL_WAIT_S)]


def _runs(process: subprocess.Popen[bytes]) -> bool:
    """It runs, or it led a group (its pid is the group's id) of which a member still runs."""
    return process.poll() is None or group_runs(process.pid)


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """SIGTERM to the process, SIGKILL to its group; either to its group once it has gone (nobody passes it on)."""
    if process.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    elif sig == signal.SIGTERM:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
    else:
        _signal_group(process.pid, sig)


def _wait_all(processes: list[subprocess.Popen[bytes]], timeout_s: float) -> list[subprocess.Popen[bytes]]:
    deadline = time.monotonic() + timeout_s
    while True:
        running = [p for p in processes if _runs(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(_POLL_S)


def _gone(process: psutil.Process) -> bool:
    """Exited (a zombie not yet reaped by whoever adopted it counts as gone); a reused pid is not ours."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class ReplicaRecord:
    """Every process seen under the controller while it ran, to stop whatever of them is left at the end."""

    def __init__(self) -> None:
        self.seen: dict[int, psutil.Process] = {}

    def record(self, controller_pid: int | None) -> list[psutil.Process]:
        """Note the controller's descendants now; returns them (the CPU pool reads their affinities)."""
        if controller_pid is None:
            return []
        try:
            children = psutil.Process(controller_pid).children(recursive=True)
        except psutil.Error:
            return []
        for child in children:
            known = self.seen.get(child.pid)
            if known is None or known != child:  # psutil compares pid and start time: a reused pid is new
                self.seen[child.pid] = child
        return children

    def left(self) -> list[psutil.Process]:
        return [p for p in self.seen.values() if not _gone(p)]

    def stop_left(self, timeout_s: float = 10.0) -> list[int]:
        """SIGTERM the process group of each recorded process still running, SIGKILL after ``timeout_s``;
        the pids still running after that."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
            left = self.left()
            for process in left:
                _signal_group(process.pid, sig)
            deadline = time.monotonic() + wait_s
            while left and time.monotonic() < deadline:
                time.sleep(_POLL_S)
                left = [p for p in left if not _gone(p)]
            if not left:
                return []
        return [p.pid for p in self.left()]
