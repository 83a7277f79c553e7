"""Processes of the local stack: a supervisor, and Prometheus and Alertmanager under it.

Every process binds 127.0.0.1, writes its log under the run's folder, and is
stopped (SIGTERM to all at once, then SIGKILL after a bounded wait) when the stack ends,
or gets SIGTERM from Linux when ``moeslo up`` itself dies without a stop (a SIGKILL, the OOM killer).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.monitoring import (
    ALERTMANAGER_BINARIES,
    PROMETHEUS_BINARIES,
    alertmanager_command,
    find_binary,
    prometheus_command,
    scrape_config,
)
from harness.processes import log_tail, start_process, stop_process, wait_healthy
from stack.shutdown import stop_processes

MONITORING_NICE = 10
"""Prometheus and Alertmanager run at a lower CPU priority: on one machine they share the CPUs the
replicas are pinned to, where in a cluster they would run on nodes of their own."""


@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        stop_process(self.process, timeout_s)

    def log_tail(self, chars: int = 1500) -> str:
        return log_tail(self.log_path, chars)

    def wait_ready(self, url: str, timeout_s: float) -> None:
        """Until ``url`` answers 200; UnavailableError with the log if the process dies or time runs out."""
        wait_healthy(url, self.process, timeout_s, name=self.name, log_path=self.log_path)


class Supervisor:
    """Starts processes and stops them all, newest first.

    Each process is asked to die with the supervisor's process (``PR_SET_PDEATHSIG``, which the kernel sends
    when the *thread* that started it exits): call :meth:`start` from the main thread (``moeslo up`` does).
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[ManagedProcess] = []

    def start(
        self, name: str, argv: Sequence[str], cwd: Path | None = None, cpus: Sequence[int] | None = None,
        *, nice: int = 0,
    ) -> ManagedProcess:
        """Start ``argv`` (pinned to ``cpus`` when given; at a lower CPU priority when ``nice`` > 0)."""
        log_path = self.log_dir / f"{name}.log"
        if nice > 0 and (nice_exe := shutil.which("nice")) is not None:
            argv = [nice_exe, "-n", str(nice), *argv]
        process = start_process(argv, log_path=log_path, cwd=cwd, cpus=cpus, die_with_parent=True)
        managed = ManagedProcess(name, process, log_path)
        self.processes.append(managed)
        return managed

    def stop_all(self, timeout_s: float = 15.0) -> list[str]:
        """SIGTERM to every process at once, SIGKILL to what is left after ``timeout_s`` (one deadline for all,
        where one at a time a slow one held up the rest); the processes still running after that."""
        still = set(stop_processes([m.process for m in self.processes], timeout_s))
        return [f"{m.name} (pid {m.process.pid})" for m in self.processes if m.process.pid in still]


def start_prometheus(
    supervisor: Supervisor, workdir: Path, *, port: int, targets: dict[str, list[str]],
    rule_files: Sequence[Path], alertmanager_port: int | None, scrape_interval_s: float = 2.0,
    discovered: dict[str, str] | None = None,
) -> ManagedProcess | None:
    """Prometheus scraping ``targets`` (job -> host:port list) and ``discovered`` (job -> HTTP service-discovery
    URL); None when it is not installed."""
    exe = find_binary(*PROMETHEUS_BINARIES)
    if exe is None:
        return None
    config = scrape_config(targets, interval_s=scrape_interval_s, rule_files=list(rule_files),
                           alertmanager_port=alertmanager_port, discovered=discovered)
    proc = supervisor.start("prometheus", prometheus_command(exe, workdir, port=port, config=config),
                            nice=MONITORING_NICE)
    proc.wait_ready(f"http://127.0.0.1:{port}/-/ready", timeout_s=60)
    return proc


def start_alertmanager(
    supervisor: Supervisor, workdir: Path, *, port: int, config: dict[str, Any]
) -> ManagedProcess | None:
    """Alertmanager with ``config``; None when it is not installed."""
    exe = find_binary(*ALERTMANAGER_BINARIES)
    if exe is None:
        return None
    proc = supervisor.start("alertmanager", alertmanager_command(exe, workdir, port=port, config=config),
                            nice=MONITORING_NICE)
    proc.wait_ready(f"http://127.0.0.1:{port}/-/ready", timeout_s=60)
    return proc
