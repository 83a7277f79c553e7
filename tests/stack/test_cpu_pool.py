"""The shared CPU pool: the control plane keeps off the replicas' CPUs while one is free, shares them when none is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stack.cpu_pool import SharedCpuPool, replica_cpus

MACHINE = frozenset(sorted(os.sched_getaffinity(0))[:2])
pytestmark = [
    pytest.mark.skipif(len(MACHINE) < 2, reason="needs two CPUs"),
    pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads threads from /proc"),
]
FIRST, SECOND = sorted(MACHINE)

SLEEPER = (
    "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "time.sleep(60)\n"
)
CONTROLLER = (
    "import os, subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
    "        preexec_fn=lambda c=int(c): os.sched_setaffinity(0, {c})) for c in sys.argv[1:]]\n"
    "print('started', flush=True)\n"
    "time.sleep(60)\n"
)


def _affinities(pid: int) -> set[frozenset[int]]:
    """The distinct affinities of a process's threads."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


def _start_controller(*replica_cpus: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, *map(str, replica_cpus)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    return proc


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], text=True)
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{proc.pid}/task")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield proc
    proc.kill()
    proc.wait()


def _stop(proc: subprocess.Popen[str]) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_the_pool_is_what_the_replicas_leave_and_the_whole_machine_when_they_leave_nothing() -> None:
    pool = SharedCpuPool(MACHINE, lambda: None, list)
    assert pool.pool_for(frozenset()) == MACHINE
    assert pool.pool_for(frozenset({FIRST})) == MACHINE - {FIRST}
    assert pool.pool_for(MACHINE) == MACHINE


def test_the_control_plane_follows_the_replicas_cpus(sleeper: subprocess.Popen[str]) -> None:
    before = os.sched_getaffinity(0)
    controller = _start_controller(FIRST)
    pids = [sleeper.pid, controller.pid]
    pool = SharedCpuPool(MACHINE, lambda: controller.pid, lambda: pids)
    try:
        assert replica_cpus(controller.pid) == {FIRST}
        line = pool.update()
        assert line is not None and f"CPU(s) {SECOND}" in line
        assert _affinities(sleeper.pid) == {frozenset({SECOND})}  # every thread, not only the main one
        assert _affinities(controller.pid) == {frozenset({SECOND})}
        assert os.sched_getaffinity(0) == {SECOND}  # the stack's own process too
        assert replica_cpus(controller.pid) == {FIRST}, "the replica keeps its own CPU"
        assert pool.update() is None, "nothing changed, nothing re-pinned"
    finally:
        _stop(controller)
    second = _start_controller(FIRST, SECOND)
    pids[1] = second.pid
    try:
        pool.controller_pid = lambda: second.pid
        line = pool.update()
        assert line is not None and "shares theirs" in line
        assert _affinities(sleeper.pid) == {MACHINE}
    finally:
        _stop(second)
        pool.release()
    assert os.sched_getaffinity(0) == before

