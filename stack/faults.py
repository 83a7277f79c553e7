"""The fault ``moeslo up`` injects: CPU throttling of every engine replica.

What a Kubernetes CPU limit (CFS quota) or a noisy neighbour does to a pod: the
replica's processes run only part of each period.  Here every process group
serving an engine port is stopped (SIGSTOP) for ``stopped_s`` of every
``period_s`` and resumed (SIGCONT), from ``start`` to ``end``; the groups are
looked up afresh every ``LOOKUP_S``, so a replica started during the fault is
throttled too (the lookup walks every process's sockets: once a period, it
took a fifth of a CPU).  Every group is resumed when the fault ends or the stack stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Sequence

import psutil

__all__ = ["LOOKUP_S", "CpuThrottle", "process_groups_on_ports"]

LOOKUP_S = 1.0
"""How often the throttle looks the engines' process groups up again."""


def process_groups_on_ports(ports: Sequence[int]) -> set[int]:
    """Process groups of the processes listening on ``ports`` on this machine."""
    wanted = set(ports)
    groups: set[int] = set()
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in wanted and conn.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    groups.add(os.getpgid(conn.pid))
    groups.discard(os.getpgid(0))  # never the stack itself
    return groups


class CpuThrottle:
    """Stops and resumes the engines' process groups on a duty cycle while the fault lasts."""

    def __init__(self, ports: Sequence[int], *, period_s: float = 0.5, stopped_s: float = 0.3) -> None:
        if not 0 < stopped_s < period_s:
            raise ValueError(f"stopped_s must be in (0, period_s), got {stopped_s} of {period_s}")
        self.ports = list(ports)
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
                    groups = await asyncio.to_thread(process_groups_on_ports, self.ports)
                    looked_up = loop.time()
                self._signal(groups, signal.SIGSTOP)
                self._stopped = set(groups)  # a copy: resume_all clears it, and the groups serve the next period
                await asyncio.sleep(self.stopped_s)
                self.resume_all()
                await asyncio.sleep(self.period_s - self.stopped_s)
        finally:
            self.resume_all()
