"""The injected fault: each replica the controller started is stopped for most of every period, for the whole
fault; nothing else is."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.processes import free_port, start_process, stop_process
from stack.faults import LOOKUP_S, CpuThrottle, child_process_groups

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

LISTENER = "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n" \
           "print('listening', flush=True)\ntime.sleep(60)\n"
CONTROLLER = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], start_new_session=True)\n"
              "print('child', child.pid, flush=True)\ntime.sleep(60)\n")
"""A stand-in for the controller: it starts one replica (a listener) in a session of its own, as the local
actuator does."""


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(log: Path, word: str) -> str:
    deadline = time.monotonic() + 10
    while word not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return log.read_text()


def test_the_throttle_stops_the_controllers_replica_in_every_period_until_it_ends(tmp_path: Path) -> None:
    controller_log, bystander_log = tmp_path / "controller.log", tmp_path / "bystander.log"
    controller = start_process([sys.executable, "-c", CONTROLLER, LISTENER, str(free_port())], log_path=controller_log)
    # Someone else's server, listening on the port next to the replica's: the throttle must leave it alone.
    bystander = start_process([sys.executable, "-c", LISTENER, str(free_port())], log_path=bystander_log)
    replica = 0
    try:
        replica = int(_wait_for(controller_log, "child").split()[1])
        _wait_for(bystander_log, "listening")
        assert child_process_groups(controller.pid) == {replica}
        throttle = CpuThrottle(lambda: child_process_groups(controller.pid), period_s=0.1, stopped_s=0.08)
        duration_s = 2 * LOOKUP_S + 0.5
        samples: list[tuple[float, str, str]] = []

        async def watch() -> None:
            began = time.monotonic()
            while time.monotonic() - began < duration_s - 0.1:
                samples.append((time.monotonic() - began, _state(replica), _state(bystander.pid)))
                await asyncio.sleep(0.013)

        async def both() -> None:
            await asyncio.gather(throttle.run(duration_s), watch())

        asyncio.run(both())
        # After the first lookup too (a later period reuses the groups it found), most samples see it stopped.
        for start, end in ((0.2, LOOKUP_S), (LOOKUP_S + 0.2, duration_s - 0.1)):
            states = [state for t, state, _ in samples if start <= t < end]
            assert states and states.count("T") / len(states) >= 0.5, (start, end, states)
        assert all(other != "T" for _, _, other in samples)
        assert _state(replica) != "T"  # resumed when the fault ends
        assert child_process_groups(None) == set()
    finally:
        stop_process(controller, 5.0, group=True)
        stop_process(bystander, 5.0, group=True)
        if replica:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica, signal.SIGKILL)
