"""/v1/policies/{name}/endpoints: the replica list routers read."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient

from controller.api import create_app
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.store import Store
from tests.controller.api.conftest import AUTH, TOKEN

NAMED = "http://127.0.0.1:9001"
STARTED = ("http://127.0.0.1:9100", "http://127.0.0.1:9101")
POLICY = {"name": "qwen", "target": {"kind": "local", "model": "m", "endpoints": [NAMED]}}


class View:
    """A leader whose actuator started two replicas for the policy."""

    is_leader = True
    last_tick_at = datetime(2026, 1, 1, tzinfo=UTC)

    def runtime(self, name: str) -> PolicyRuntime | None:
        return None

    def check_target(self, policy: Policy) -> list[str]:
        return []

    def endpoints_for(self, policy: Policy) -> list[str]:
        assert isinstance(policy, Policy)
        return [*getattr(policy.target, "endpoints", ()), *STARTED]


def _client(tmp_path: Path, service: View | None) -> TestClient:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN,
                                  allowed_endpoint_addresses=["loopback"])  # type: ignore[arg-type]
    return TestClient(create_app(settings, Store(settings.db_url), service=service))


def test_the_leader_lists_named_and_started_replicas(tmp_path: Path) -> None:
    client = _client(tmp_path, View())
    assert client.post("/v1/policies", json=POLICY, headers=AUTH).status_code == 201
    body = client.get("/v1/policies/qwen/endpoints").json()
    assert body == {"policy": "qwen", "endpoints": [NAMED, *STARTED], "leader": True}


def test_without_a_service_only_the_targets_named_endpoints_are_listed(tmp_path: Path) -> None:
    client = _client(tmp_path, None)
    client.post("/v1/policies", json=POLICY, headers=AUTH)
    assert client.get("/v1/policies/qwen/endpoints").json() == {"policy": "qwen", "endpoints": [NAMED],
                                                                 "leader": False}


def test_an_unknown_policy_is_a_404_problem(tmp_path: Path) -> None:
    answer = _client(tmp_path, View()).get("/v1/policies/nope/endpoints")
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/problem+json")


def test_scrape_targets_are_every_replica_once_in_prometheus_http_sd_form(tmp_path: Path) -> None:
    client = _client(tmp_path, View())
    assert client.get("/v1/scrape-targets").json() == []
    client.post("/v1/policies", json=POLICY, headers=AUTH)
    other = {"name": "other", "target": {"kind": "local", "model": "m2", "endpoints": ["http://127.0.0.1:9002/e1/"]}}
    assert client.post("/v1/policies", json=other, headers=AUTH).status_code == 201
    groups = client.get("/v1/scrape-targets").json()
    # The replicas the actuator started for both policies are one target each (twice, they would count twice).
    assert groups == [
        {"targets": ["127.0.0.1:9002"], "labels": {"__scheme__": "http", "__metrics_path__": "/e1/metrics"}},
        {"targets": ["127.0.0.1:9001", "127.0.0.1:9100", "127.0.0.1:9101"],
         "labels": {"__scheme__": "http", "__metrics_path__": "/metrics"}},
    ]  # fmt: skip
    (tmp_path / "alone").mkdir()
    alone = _client(tmp_path / "alone", None)
    alone.post("/v1/policies", json=POLICY, headers=AUTH)
    assert alone.get("/v1/scrape-targets").json()[0]["targets"] == ["127.0.0.1:9001"]
