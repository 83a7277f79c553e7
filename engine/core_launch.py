"""Starting the engine-core process from the API process, and waiting for its READY (:mod:`engine.client`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import zmq

from contracts.errors import UnavailableError
from engine import wire
from engine.core_proc import CoreOptions

POLL_S = 0.1


def launch_core(options: CoreOptions) -> subprocess.Popen[bytes]:
    """``python -m engine.core_proc`` with ``options`` on its stdin."""
    # OpenMP workers that sleep at barriers instead of spinning: a replica's processes share one CPU set,
    # and spinning workers measured 10x slower steps whenever another process wanted the same CPUs.
    env = {**os.environ}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    proc = subprocess.Popen([sys.executable, "-m", "engine.core_proc"], stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(options.to_json().encode())
    proc.stdin.close()
    return proc


def wait_ready(proc: subprocess.Popen[bytes], outputs: zmq.Socket[bytes], timeout_s: float) -> dict[str, Any]:
    """The core's READY information once its model is loaded; UnavailableError if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if outputs.poll(int(POLL_S * 1000)):
            msg = wire.unpack(outputs.recv())
            if msg[0] != wire.READY:
                continue
            info: dict[str, Any] = msg[1]
            if "error" in info:
                raise wire.error_from_wire(info["error"])
            return info
        if proc.poll() is not None:
            raise UnavailableError(f"the engine core exited with status {proc.returncode} while starting")
    raise UnavailableError(f"the engine core did not load the model within {timeout_s:g} s")
