"""Stopping a child process: SIGTERM, a bounded wait, then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30.0, *, group: bool = False) -> None:
    """Ask ``proc`` (its whole process group with ``group``) to stop; kill it after ``timeout_s``."""
    if proc.poll() is not None:
        return

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(10)
