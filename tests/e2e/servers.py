"""Real Prometheus and Alertmanager processes on 127.0.0.1, and a webhook receiver, for tests.

Each helper skips the test when its binary is absent, waits a bounded time for
readiness, and stops what it started.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(f"{' / '.join(names)} not installed (apt-get install prometheus prometheus-alertmanager)")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise AssertionError(f"{url} exited with {proc.returncode}: {err[-2000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {timeout_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextmanager
def prometheus(tmp_path: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus with ``config`` (a prometheus.yml mapping); yields its base URL."""
    exe = binary("prometheus")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [exe, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'prom-data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, f"{url}/-/ready")
        yield url
    finally:
        _stop(proc)


@contextmanager
def alertmanager(tmp_path: Path, config_text: str) -> Iterator[str]:
    """Alertmanager (clustering off) with ``config_text``; yields its base URL."""
    exe = binary("alertmanager", "prometheus-alertmanager")
    port = free_port()
    (tmp_path / "alertmanager.yml").write_text(config_text)
    proc = subprocess.Popen(
        [exe, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, f"{url}/-/ready")
        yield url
    finally:
        _stop(proc)


@dataclass
class WebhookReceiver:
    """Collects Alertmanager webhook posts by path (``/page``, ``/ticket``)."""

    url: str
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [alert for where, body in self.posts if where == path for alert in body.get("alerts", [])]

    def wait_for(self, path: str, predicate: Any, timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [a for a in self.alerts(path) if predicate(a)]
            if found:
                return found
            time.sleep(0.2)
        return []


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver: WebhookReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            with receiver.lock:
                receiver.posts.append((self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = WebhookReceiver(url=f"http://127.0.0.1:{server.server_port}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
