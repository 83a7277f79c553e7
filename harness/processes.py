"""Real processes for the local stack, the benchmarks and the end-to-end tests.

One way to pick a free port, start a process with its output in a log,
wait until it answers, and stop it (SIGTERM, a bounded wait, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from contracts.errors import UnavailableError
from contracts.lifetime import child_setup, group_runs

log = logging.getLogger(__name__)
KILL_WAIT_S = 10.0
"""How long :func:`stop_process` waits for a process to go after SIGKILL."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_process(
    argv: Sequence[str],
    *,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = True,
    cpus: Sequence[int] | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr in ``log_path`` (discarded when None).

    ``new_session`` puts it in its own process group, so :func:`stop_process` with
    ``group=True`` reaches the children it spawns, and Ctrl-C in a terminal does not.
    ``cpus`` pins it (and what it spawns) to those CPUs.  ``die_with_parent`` has Linux send it
    SIGTERM when this process dies, a SIGKILL or the OOM killer included: call it from a thread that
    lasts as long as this process (see :func:`contracts.lifetime.child_setup`).
    """
    log: IO[bytes] | int = subprocess.DEVNULL
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("wb")
    try:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=new_session,
                                preexec_fn=child_setup(cpus or (), die_with_parent=die_with_parent))  # noqa: PLW1509
    finally:
        if not isinstance(log, int):
            log.close()  # the child holds its own descriptor


def log_tail(log_path: Path | None, chars: int = 2000) -> str:
    """The last ``chars`` of a process log ('' when there is none)."""
    if log_path is None:
        return ""
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_healthy(
    url: str,
    proc: subprocess.Popen[Any],
    timeout_s: float,
    *,
    name: str = "process",
    log_path: Path | None = None,
    interval_s: float = 0.25,
) -> None:
    """Poll ``url`` until it answers 200; UnavailableError (with the log's tail) if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UnavailableError(f"{name} exited with {proc.returncode}:\n{_output(proc, log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(interval_s)
    raise UnavailableError(f"{name} did not answer {url} within {timeout_s:.0f} s:\n{log_tail(log_path)}")


def _output(proc: subprocess.Popen[Any], log_path: Path | None) -> str:
    if log_path is not None:
        return log_tail(log_path)
    if proc.stderr is not None:  # the process has exited, so reading its pipe cannot block
        data = proc.stderr.read()
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        return text[-2000:]
    return ""


def stop_process(
    proc: subprocess.Popen[Any], timeout_s: float = 30.0, *, group: bool = False, sig: signal.Signals = signal.SIGTERM
) -> None:
    """Ask ``proc`` (its whole process group with ``group``) to stop with ``sig``; kill it after ``timeout_s``.

    With ``group`` the group is signalled while any member lives, whether or not ``proc`` itself has exited: a
    leader that crashed, or left on SIGTERM, used to leave the rest of its group (a vLLM engine core) running.
    Never raises: a process still not gone ``KILL_WAIT_S`` after SIGKILL (a teardown stuck in the kernel) is
    logged and left to exit, where a TimeoutExpired out of here cut short the stop of every process after it.
    """

    def alive() -> bool:
        leader = proc.poll() is None  # polled first either way: a reaped leader no longer holds its group
        return group_runs(proc.pid) if group else leader

    def send(signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)

    for signum, wait_s in ((sig, timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not alive():
            return
        send(signum)
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
        while group and alive() and time.monotonic() < deadline:  # the leader is gone; the rest of its group next
            time.sleep(0.05)
    if alive():
        log.warning("process %d%s is not gone %.3g s after SIGKILL; left to exit", proc.pid,
                    "'s group" if group else "", KILL_WAIT_S)  # fmt: skip


def moeslo_command(*args: str) -> list[str]:
    """The ``moeslo`` command line run by this interpreter (the venv's bin/ need not be on PATH)."""
    return [sys.executable, "-c", "from cli.main import app; app()", *args]


__all__ = ["free_port", "log_tail", "moeslo_command", "start_process", "stop_process", "wait_healthy"]
