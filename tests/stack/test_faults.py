"""The injected fault: a process serving a port is stopped for most of every period, for the whole fault."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from harness.processes import free_port, start_process, stop_process
from stack.faults import LOOKUP_S, CpuThrottle

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

LISTENER = "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n" \
           "print('listening', flush=True)\ntime.sleep(60)\n"


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_throttle_stops_the_listener_in_every_period_until_it_ends(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "listener.log"
    proc = start_process([sys.executable, "-c", LISTENER, str(port)], log_path=log)
    try:
        deadline = time.monotonic() + 10
        while "listening" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        throttle = CpuThrottle([port], period_s=0.1, stopped_s=0.08)
        duration_s = 2 * LOOKUP_S + 0.5
        samples: list[tuple[float, str]] = []

        async def watch() -> None:
            began = time.monotonic()
            while time.monotonic() - began < duration_s - 0.1:
                samples.append((time.monotonic() - began, _state(proc.pid)))
                await asyncio.sleep(0.013)

        async def both() -> None:
            await asyncio.gather(throttle.run(duration_s), watch())

        asyncio.run(both())
        # After the first lookup too (a later period reuses the groups it found), most samples see it stopped.
        for start, end in ((0.2, LOOKUP_S), (LOOKUP_S + 0.2, duration_s - 0.1)):
            states = [state for t, state in samples if start <= t < end]
            assert states and states.count("T") / len(states) >= 0.5, (start, end, states)
        assert _state(proc.pid) != "T"  # resumed when the fault ends
    finally:
        stop_process(proc, 5.0, group=True)
