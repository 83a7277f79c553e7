"""Processes of the local stack: a supervisor, Prometheus, Alertmanager, and a webhook receiver.

Every process binds 127.0.0.1, writes its log under the run's folder, and is
stopped (SIGTERM, then SIGKILL after a bounded wait) when the stack ends.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.processes import stop_process
from contracts.errors import UnavailableError


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
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Supervisor:
    """Starts processes and stops them all, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[ManagedProcess] = []

    def start(self, name: str, argv: Sequence[str], cwd: Path | None = None) -> ManagedProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        managed = ManagedProcess(name, proc, log_path)
        self.processes.append(managed)
        return managed

    def stop_all(self) -> None:
        for managed in reversed(self.processes):
            managed.stop()


def wait_http(url: str, proc: ManagedProcess, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; fail with the process log if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise UnavailableError(f"{proc.name} exited with {proc.process.returncode}:\n{proc.log_tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise UnavailableError(f"{proc.name} did not answer {url} within {timeout_s:.0f} s:\n{proc.log_tail()}")


def find_binary(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def start_prometheus(
    supervisor: Supervisor, workdir: Path, *, port: int, targets: dict[str, list[str]],
    rule_files: Sequence[Path], alertmanager_port: int | None, scrape_interval_s: float = 2.0,
) -> ManagedProcess | None:
    """Prometheus scraping ``targets`` (job -> host:port list); None when it is not installed."""
    exe = find_binary("prometheus")
    if exe is None:
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{scrape_interval_s:g}s", "evaluation_interval": f"{scrape_interval_s:g}s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
        ],
    }
    if alertmanager_port is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = supervisor.start("prometheus", [
        exe, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d", "--log.level=warn",
    ])
    wait_http(f"http://127.0.0.1:{port}/-/ready", proc, timeout_s=60)
    return proc


def start_alertmanager(
    supervisor: Supervisor, workdir: Path, *, port: int, config: dict[str, Any]
) -> ManagedProcess | None:
    exe = find_binary("alertmanager", "prometheus-alertmanager")
    if exe is None:
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = supervisor.start("alertmanager", [
        exe, f"--config.file={config_path}", f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn",
    ])
    wait_http(f"http://127.0.0.1:{port}/-/ready", proc, timeout_s=60)
    return proc


@dataclass
class WebhookReceiver:
    """Collects Alertmanager webhook notifications (the demo's pager)."""

    port: int
    notifications: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> WebhookReceiver:
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    payload = json.loads(body)
                except json.JSONDecodeError:
                    payload = {"raw": body.decode(errors="replace")}
                payload["receiver_path"] = self.path
                received.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="moeslo-pager", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
