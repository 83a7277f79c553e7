"""The fault ``moeslo up`` injects: CPU throttling of every engine replica.

What a Kubernetes CPU limit (CFS quota) or a noisy neighbour does to a pod: the
replica's processes run only part of each period.  Here the process group of every
replica the controller started (the controller's children: the local actuator starts
each in a session of its own) is stopped (SIGSTOP) for ``stopped_s`` of every
``period_s`` and resumed (SIGCONT), from ``start`` to ``end``; the groups are looked up
afresh every ``LOOKUP_S``, so a replica started during the fault is throttled too.
Nothing the stack did not start is signalled: a process of someone else's that listens
near the replicas' ports runs on.  Every group is resumed when the fault ends or the
stack stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Callable

import psutil

from stack.state import StackState

__all__ = ["LOOKUP_S", "CpuThrottle", "child_process_groups", "inject_fault"]

LOOKUP_S = 1.0
"""How often the throttle looks the replicas' process groups up again."""


def child_process_groups(parent_pid: int | None) -> set[int]:
    """Process groups of ``parent_pid``'s children (none when it is gone), never the caller's own group."""
    groups: set[int] = set()
    if parent_pid is None:
        return groups
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(parent_pid).children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                groups.add(os.getpgid(child.pid))
    groups.discard(os.getpgid(0))
    return groups


class CpuThrottle:
    """Stops and resumes the engines' process groups on a duty cycle while the fault lasts."""

    def __init__(self, groups: Callable[[], set[int]], *, period_s: float = 0.5, stopped_s: float = 0.3) -> None:
        """``groups``: the process groups to throttle now (called from a worker thread every ``LOOKUP_S``)."""
        if not 0 < stopped_s < period_s:
            raise ValueError(f"stopped_s must be in (0, period_s), got {stopped_s} of {period_s}")
        self.groups = groups
        self.period_s = period_s
        self.stopped_s = stopped_s
        self._stopped: set[int] = set()

    def describe(self) -> str:
        share = self.stopped_s / self.period_s
        return f"CPU throttling of every replica ({share:.0%} of each {self.period_s * 1000:.0f} ms stopped)"

    def _signal(self, groups: set[int], sig: signal.Signals) -> None:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)

    def resume_all(self) -> None:
        self._signal(self._stopped, signal.SIGCONT)
        self._stopped.clear()

    async def run(self, duration_s: float) -> None:
        """Throttle for ``duration_s``; always leaves every group running."""
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        groups: set[int] = set()
        looked_up = -math.inf
        try:
            while loop.time() < end:
                if loop.time() - looked_up >= LOOKUP_S:
                    groups = await asyncio.to_thread(self.groups)
                    looked_up = loop.time()
                self._signal(groups, signal.SIGSTOP)
                self._stopped = set(groups)  # a copy: resume_all clears it, and the groups serve the next period
                await asyncio.sleep(self.stopped_s)
                self.resume_all()
                await asyncio.sleep(self.period_s - self.stopped_s)
        finally:
            self.resume_all()


async def inject_fault(state: StackState, controller_pid: Callable[[], int | None]) -> None:
    """The run's fault: ``slowdown_at_s`` into the load, every replica the controller started is throttled for
    ``slowdown_for_s``, or until the load ends and cancels it.  ``state.fault`` holds its planned end while it
    runs, and the end it had once over (a fault cut short by the load's end was reported as planned)."""
    options = state.options
    await asyncio.sleep(options.slowdown_at_s)
    # A quarter of each 20 ms, as a CFS CPU quota throttles a container whose neighbours took its share.
    # Periods shorter than a step stretch every step (a 100 ms period left a step in each run window
    # unharmed), and a quarter still flows: the fault's slow tokens are enough of the run's to burn
    # the ITL budget past the page threshold at the demo's light load (85 % of 100 ms peaked at 13.6 %).
    throttle = CpuThrottle(lambda: child_process_groups(controller_pid()), period_s=0.02, stopped_s=0.015)
    start = state.elapsed()
    state.fault = (start, start + options.slowdown_for_s)
    state.event(f"fault injected for {options.slowdown_for_s:.0f} s: {throttle.describe()}")
    ran_out = False
    try:
        await throttle.run(options.slowdown_for_s)
        ran_out = True
    finally:
        end = state.elapsed()
        state.fault = (start, end)
        if ran_out:
            state.event("fault over: every replica runs freely again (the requests it delayed stay in the SLI "
                        "windows a while; the summary's within-SLO shares outside the fault leave them out)")
        else:
            state.event(f"fault cut short after {end - start:.1f} s of its {options.slowdown_for_s:g} s: the load "
                        f"ended first")
