"""Starting the engine-core process from the API process, and waiting for its READY (:mod:`engine.client`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any

import zmq

from contracts.errors import UnavailableError
from engine import wire
from engine.core_proc import CoreOptions
from engine.engine_types import EngineConfig
from engine.executors.options import ExecutorOptions, default_threads

POLL_S = 0.1


def core_options(executor: ExecutorOptions, engine: EngineConfig, input_address: str,
                 output_address: str) -> CoreOptions:
    """The options of a core started from this thread of this process, on these two addresses."""
    if executor.threads_per_rank is None:
        # Every CPU of the replica's set (the API process's work is small and the engine's OpenMP workers
        # sleep while it runs): one thread fewer measured a 2-4x slower prefill on 2 CPUs.
        executor = dataclasses.replace(executor, threads_per_rank=default_threads(
            1 if executor.colocate_ranks else executor.ep))
    return CoreOptions(
        executor=executor, engine=engine, input_address=input_address, output_address=output_address,
        parent_pid=os.getpid(), die_with_parent=threading.current_thread() is threading.main_thread(),
        log_level=logging.getLevelName(max(logging.getLogger().getEffectiveLevel(), logging.INFO)),
    )


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
