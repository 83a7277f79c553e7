"""Whether processes are gone, for the tests that kill a parent and look for what it started.

A process whose parent died is reparented to PID 1, which in a container may never reap it: a zombie
counts as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence

import psutil

__all__ = ["gone", "kill_quietly", "still_running"]


def gone(pid: int) -> bool:
    """``pid`` has exited (a zombie included)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def still_running(pids: Sequence[int], within_s: float = 10.0) -> list[int]:
    """Those of ``pids`` still running once all are gone or ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def kill_quietly(pids: Sequence[int]) -> None:
    """SIGKILL to each of ``pids`` still there (a test's clean-up)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
