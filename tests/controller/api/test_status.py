"""Read views: /v1/status, /v1/decisions (paginated), /health, /metrics, the OpenAPI schema."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from controller.api import create_app
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.service import build_service
from controller.store import DecisionRecord, Store
from controller.telemetry import ControllerMetrics
from tests.controller.api.conftest import AUTH, TOKEN

POLICY = {"name": "qwen", "target": {"kind": "local", "model": "m"}}


class View:
    is_leader = True
    last_tick_at = datetime(2026, 1, 1, tzinfo=UTC)

    def wall_clock(self) -> datetime:
        """The service's clock: a second after its last tick (what it shows is current)."""
        return self.last_tick_at + timedelta(seconds=1)

    def runtime(self, name: str) -> PolicyRuntime | None:
        return PolicyRuntime(
            current_replicas=2, desired_replicas=3, stale=False, observed_at=self.last_tick_at,
            sli={"ttft_good_ratio": 0.97, "itl_p99_seconds": 0.018},
            error_budget_remaining={"ttft": -2.0, "itl": 0.5},
            burn_rates={"ttft": {"5m": 3.0, "1h": 2.0}}, errors=[],
        )

    def check_target(self, policy: Policy) -> list[str]:
        return ["target.checkpoint: required"] if policy.name == "refused" else []


def _client(tmp_path: Path) -> tuple[TestClient, Store, CollectorRegistry]:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    store = Store(settings.db_url)
    registry = CollectorRegistry()
    app = create_app(settings, store, registry=registry, service=View())
    return TestClient(app), store, registry


def _record(policy: str, i: int) -> DecisionRecord:
    return DecisionRecord(
        policy=policy, policy_version=1, at=datetime.now(UTC), tick_s=float(i), action="scale_up",
        reason="queue_depth", current_replicas=2, desired_replicas=3, mode="enforce", outcome="applied",
        detail=f"tick {i}", inputs={"queue_depth": 7.0, "reasons": ["scale_up", "queue_depth"]},
    )


def test_status_reports_slis_budgets_burn_rates_replicas_and_last_decisions(tmp_path: Path) -> None:
    client, store, _ = _client(tmp_path)
    client.post("/v1/policies", json=POLICY, headers=AUTH)
    store.append_decisions([_record("qwen", i) for i in range(8)])
    body = client.get("/v1/status").json()
    assert body["leader"] is True and body["embedded"] is True and body["mode"] == "leader"
    [policy] = body["policies"]
    assert (policy["current_replicas"], policy["desired_replicas"], policy["stale"]) == (2, 3, False)
    assert policy["sli"]["ttft_good_ratio"] == 0.97
    assert policy["error_budget_remaining"] == {"ttft": -2.0, "itl": 0.5}
    assert policy["burn_rates"]["ttft"]["5m"] == 3.0
    assert [d["detail"] for d in policy["last_decisions"]] == [f"tick {i}" for i in range(7, 2, -1)]
    one = client.get("/v1/status/qwen")
    assert one.status_code == 200 and one.json()["name"] == "qwen"
    assert client.get("/v1/status/ghost").status_code == 404


class NeverTicked(View):
    """A service whose first tick has not ended (a hung read): no tick has succeeded since it started."""

    last_tick_at = None  # type: ignore[assignment]
    started_at = datetime(2026, 1, 1, tzinfo=UTC)

    def __init__(self, running_s: float) -> None:
        self.running_s = running_s

    def wall_clock(self) -> datetime:
        return self.started_at + timedelta(seconds=self.running_s)


def test_with_no_tick_yet_the_tick_is_overdue_three_intervals_after_the_start(tmp_path: Path) -> None:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)  # ticks every 15 s
    bodies = {running_s: TestClient(create_app(settings, Store(settings.db_url), service=NeverTicked(running_s)))
              .get("/v1/status").json() for running_s in (30.0, 46.0)}  # fmt: skip
    assert bodies[30.0]["last_tick_at"] is None and bodies[30.0]["tick_overdue"] is False
    assert bodies[46.0]["last_tick_at"] is None and bodies[46.0]["tick_overdue"] is True


def test_the_actuator_refuses_targets_it_cannot_scale(tmp_path: Path) -> None:
    client, _, _ = _client(tmp_path)
    response = client.post("/v1/policies", json={**POLICY, "name": "refused"}, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "target.checkpoint", "message": "required"}]


def test_decisions_are_paginated_newest_first_with_inputs(tmp_path: Path) -> None:
    client, store, _ = _client(tmp_path)
    store.append_decisions([_record("a" if i < 5 else "b", i) for i in range(12)])
    first = client.get("/v1/decisions", params={"limit": 5}).json()
    assert [d["detail"] for d in first["items"]] == [f"tick {i}" for i in range(11, 6, -1)]
    assert first["items"][0]["inputs"]["reasons"] == ["scale_up", "queue_depth"]
    second = client.get("/v1/decisions", params={"limit": 5, "cursor": first["next_cursor"]}).json()
    third = client.get("/v1/decisions", params={"limit": 5, "cursor": second["next_cursor"]}).json()
    assert len(second["items"]) == 5 and len(third["items"]) == 2 and third["next_cursor"] is None
    exact = client.get("/v1/decisions", params={"limit": 12}).json()  # a full last page leads to no empty one
    assert len(exact["items"]) == 12 and exact["next_cursor"] is None
    only_a = client.get("/v1/decisions", params={"policy": "a", "limit": 100}).json()
    assert len(only_a["items"]) == 5
    for bad in ({"limit": 0}, {"limit": 501}, {"cursor": -1}, {"limit": "ten"}):
        response = client.get("/v1/decisions", params=bad)
        assert response.status_code == 422, bad
        assert response.json()["errors"][0]["field"] in ("query.limit", "query.cursor")


def test_health_metrics_and_openapi(tmp_path: Path) -> None:
    client, _, registry = _client(tmp_path)
    metrics = ControllerMetrics(registry)
    metrics.record_decision("qwen", action="scale_up", reason="queue_depth", desired=3, current=2)
    metrics.set_leader(True)
    assert client.get("/health").json() == {"status": "ok", "leader": True, "store": "ok"}
    text = client.get("/metrics").text
    assert 'moeslo_decisions_total{action="scale_up",policy="qwen",reason="queue_depth"} 1.0' in text
    assert 'moeslo_desired_replicas{policy="qwen"} 3.0' in text
    assert "moeslo_leader 1.0" in text
    schema = client.get("/openapi.json").json()
    assert {"/v1/policies", "/v1/policies/{name}", "/v1/status", "/v1/decisions", "/v1/openslo"} <= set(schema["paths"])
    problem = schema["paths"]["/v1/policies"]["post"]["responses"]["422"]["content"]
    assert list(problem) == ["application/problem+json"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


def test_a_source_error_in_the_status_never_repeats_the_urls_password(tmp_path: Path) -> None:
    """One real tick against a Prometheus URL whose user:password httpx sends as basic auth (nothing listens on
    port 9): /v1/status reports the failure, naming the URL without them."""
    settings = ControllerSettings(db=str(tmp_path / "c.db"), prometheus_url="http://moeslo:s3cr3t@127.0.0.1:9",
                                  source_timeout_s=2.0)
    store, registry = Store(settings.db_url), CollectorRegistry()
    service = build_service(settings, store, registry)
    store.create_policy(Policy.model_validate({"name": "qwen", "target": {"kind": "model", "model": "m"}}))
    asyncio.run(service.tick())
    answer = TestClient(create_app(settings, store, registry=registry, service=service)).get("/v1/status").text
    assert "***@127.0.0.1:9" in answer and "s3cr3t" not in answer and "moeslo:" not in answer
    store.close()
