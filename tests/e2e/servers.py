"""Real Prometheus and Alertmanager processes on 127.0.0.1, and a webhook receiver, for tests.

Each helper skips the test when its binary is absent, waits a bounded time for
readiness, and stops what it started (the processes come from :mod:`harness`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.monitoring import ALERTMANAGER_BINARIES, alertmanager_command, find_binary, prometheus_command
from harness.processes import free_port, start_process, stop_process, wait_healthy
from harness.webhook import WebhookReceiver, webhook_receiver

__all__ = ["WebhookReceiver", "alertmanager", "binary", "prometheus", "webhook_receiver"]


def binary(*names: str) -> str:
    path = find_binary(*names)
    if path is None:
        pytest.skip(f"{' / '.join(names)} not installed (apt-get install prometheus prometheus-alertmanager)")
    return path


@contextmanager
def _serving(name: str, argv: list[str], port: int, log_path: Path) -> Iterator[str]:
    proc = start_process(argv, log_path=log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/-/ready", proc, 30.0, name=name, log_path=log_path, interval_s=0.2)
        yield url
    finally:
        stop_process(proc, 10.0)


@contextmanager
def prometheus(tmp_path: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus with ``config`` (a prometheus.yml mapping); yields its base URL."""
    port = free_port()
    argv = prometheus_command(binary("prometheus"), tmp_path / "prometheus", port=port, config=config)
    with _serving("prometheus", argv, port, tmp_path / "prometheus.log") as url:
        yield url


@contextmanager
def alertmanager(tmp_path: Path, config_text: str) -> Iterator[str]:
    """Alertmanager (clustering off) with ``config_text``; yields its base URL."""
    port = free_port()
    argv = alertmanager_command(binary(*ALERTMANAGER_BINARIES), tmp_path / "alertmanager", port=port,
                                config=config_text)
    with _serving("alertmanager", argv, port, tmp_path / "alertmanager.log") as url:
        yield url
