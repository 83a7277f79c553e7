"""The shared CPU pool of ``moeslo up``: the CPUs its control plane runs on.

Each replica is pinned to CPUs of its own (the local actuator's host budget).  The
rest of the stack -- this process with its load generator, Prometheus, Alertmanager,
the controller and the router -- keeps to the CPUs no replica holds, as Kubernetes'
static CPU manager keeps shared pods off the exclusive CPUs of Guaranteed ones.  When
the replicas hold every CPU the pool is the whole machine again, since nothing is left
to keep to.  The pool follows the replicas the controller starts and stops.

Why: on two CPUs one replica alone on its CPU kept 99.3-99.8 % of its token gaps within
20 ms, and 97.3-98.6 % when the control plane's wake-ups landed on its CPU too (the
controller's ITL SLI then burned at light load, before any rise).  Keeping the control
plane off the second replica's CPU as well (when no CPU is free) did worse: 98.4-98.7 %.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable

import psutil

__all__ = ["SharedCpuPool", "pin_process_tree", "replica_cpus"]


def _tasks(pid: int) -> list[int]:
    """Thread ids of a process (the affinity of a Linux process is its threads')."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def pin_process_tree(pid: int, cpus: frozenset[int], *, children: bool = True) -> None:
    """Pin every thread of ``pid`` (and of its descendants) to ``cpus``; processes gone meanwhile are skipped."""
    pids = [pid]
    if children:
        with contextlib.suppress(psutil.Error):
            pids += [child.pid for child in psutil.Process(pid).children(recursive=True)]
    for process in pids:
        for task in _tasks(process):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(task, cpus)


def replica_cpus(controller_pid: int, children: list[psutil.Process] | None = None) -> frozenset[int]:
    """The CPUs the controller's replicas (its descendant processes, or ``children`` when looked up) are
    pinned to."""
    held: set[int] = set()
    with contextlib.suppress(psutil.Error):
        for child in children if children is not None else psutil.Process(controller_pid).children(recursive=True):
            with contextlib.suppress(OSError):
                held |= os.sched_getaffinity(child.pid)
    return frozenset(held)


class SharedCpuPool:
    """Keeps the control plane on the CPUs the replicas leave free (all of them when none are free)."""

    def __init__(
        self,
        machine_cpus: Iterable[int],
        controller_pid: Callable[[], int | None],
        control_plane_pids: Callable[[], list[int]],
    ) -> None:
        self.machine_cpus = frozenset(machine_cpus)
        self.controller_pid = controller_pid
        self.control_plane_pids = control_plane_pids
        self.cpus: frozenset[int] = self.machine_cpus

    def pool_for(self, held: frozenset[int]) -> frozenset[int]:
        """The shared pool beside replicas holding ``held``."""
        return (self.machine_cpus - held) or self.machine_cpus

    def update(self, children: list[psutil.Process] | None = None) -> str | None:
        """Re-pin the control plane when the replicas' CPUs changed; a line saying so, or None.

        ``children``: the controller's descendants, when the caller has just looked them up."""
        controller = self.controller_pid()
        held = replica_cpus(controller, children) if controller is not None else frozenset()
        pool = self.pool_for(held)
        if pool == self.cpus:
            return None
        self.cpus = pool
        pin_process_tree(os.getpid(), pool, children=False)
        for pid in self.control_plane_pids():
            pin_process_tree(pid, pool, children=pid != controller)  # the controller's children are replicas
        where = _cpu_list(pool)
        if pool == self.machine_cpus and held:
            return f"control plane on CPUs {where}: the replicas hold every CPU, so it shares theirs"
        if held:
            return f"control plane on CPU(s) {where}, off the replicas' CPU(s) {_cpu_list(held)}"
        return f"control plane on CPUs {where}"

    def release(self) -> None:
        """This process back onto the whole machine (the stack's other processes are stopping)."""
        if self.cpus != self.machine_cpus:
            self.cpus = self.machine_cpus
            pin_process_tree(os.getpid(), self.machine_cpus, children=False)


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
