"""A real Prometheus finds the replicas the controller lists through its HTTP service discovery route.

``moeslo up`` scrapes the engines this way: the local actuator takes whatever ports it finds free,
so no fixed list of ports names them all.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, start_http_server

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from harness.monitoring import prometheus_command, scrape_config
from harness.processes import free_port, log_tail, start_process, stop_process
from tests.controller.api.conftest import AUTH
from tests.controller.api.page.browser import serving
from tests.controller.api.test_replica_routes import View

pytestmark = pytest.mark.integration


def test_prometheus_scrapes_the_replicas_the_controller_lists(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    registry = CollectorRegistry()
    Counter("moeslo_discovery_probe", "A series only the listed replica writes.", registry=registry).inc()
    replica_port = free_port()
    server, thread = start_http_server(replica_port, addr="127.0.0.1", registry=registry)
    settings = ControllerSettings(db=str(tmp_path / "c.db"), allowed_endpoint_addresses=["loopback"])  # type: ignore[arg-type]
    app = create_app(settings, Store(settings.db_url), service=View())
    policy = {"name": "qwen", "target": {"kind": "local", "model": "m",
                                         "endpoints": [f"http://127.0.0.1:{replica_port}"]}}  # fmt: skip
    assert TestClient(app).post("/v1/policies", json=policy, headers=AUTH).status_code == 201
    prom_port, log_path = free_port(), tmp_path / "prometheus.log"
    with serving(app) as controller_url:
        config = scrape_config({}, interval_s=1.0, discovered={"moeslo-engine": f"{controller_url}/v1/scrape-targets"})
        proc = start_process(prometheus_command(binary, tmp_path / "prom", port=prom_port, config=config),
                             log_path=log_path)  # fmt: skip
        try:
            deadline, found = time.monotonic() + 45, []
            while time.monotonic() < deadline and not found:
                time.sleep(0.5)
                answer = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query",
                                   params={"query": 'moeslo_discovery_probe_total{job="moeslo-engine"}'}, timeout=5)
                found = answer.json()["data"]["result"] if answer.status_code == 200 else []
            assert found, log_tail(log_path)
            assert found[0]["metric"]["instance"] == f"127.0.0.1:{replica_port}"
            targets = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/targets", timeout=5).json()["data"]
            # The other two the View's actuator "started" are listed too, and down: nothing serves there.
            listed = {t["labels"]["instance"]: t["health"] for t in targets["activeTargets"]}
            assert listed[f"127.0.0.1:{replica_port}"] == "up" and len(listed) == 3
        finally:
            stop_process(proc, 10.0)
            server.shutdown()
            thread.join(timeout=5)
