"""Policies written over REST cannot point the controller at odd schemes, special addresses or control bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controller.api.conftest import AUTH, make_client


def _local(endpoints: list[str], **target: object) -> dict[str, object]:
    return {"name": "local", "target": {"kind": "local", "model": "m", "endpoints": endpoints, **target}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_local(["file:///etc/passwd"]), "target.endpoints"),
        (_local(["http://169.254.169.254/"]), "target.endpoints.0"),
        (_local(["http://10.0.0.1:8000", "http://127.0.0.1:8000"]), "target.endpoints.1"),
        (_local([], model="m\x00x"), "target.model"),
        (_local([], checkpoint="/models/x\n"), "target.checkpoint"),
        ({"name": "m", "target": {"kind": "model", "model": "a\x1bb"}}, "target.model"),
        ({"name": "m", "description": "bell\x07", "target": {"kind": "model", "model": "m"}}, "description"),
    ],
)
def test_bad_endpoints_and_control_characters_are_refused(tmp_path: Path, body: dict, field: str) -> None:
    with make_client(tmp_path) as client:
        response = client.post("/v1/policies", json=body, headers=AUTH)
        assert response.status_code == 422, response.text
        # The path the client wrote: pydantic's union tag (target.local.model) is not part of it.
        assert field in [error["field"] for error in response.json()["errors"]], response.text
        assert client.get("/v1/policies").json()["items"] == []


def test_loopback_endpoints_pass_where_the_config_allows_them(tmp_path: Path) -> None:
    with make_client(tmp_path, allowed_endpoint_addresses=("loopback",)) as client:
        ok = client.post("/v1/policies", json=_local(["http://127.0.0.1:8000"]), headers=AUTH)
        assert ok.status_code == 201, ok.text
        metadata = client.put("/v1/policies/local", json=_local(["http://169.254.169.254/"]), headers=AUTH)
        assert metadata.status_code == 422 and "metadata address" in metadata.text
        patched = client.patch("/v1/policies/local", json={"target": {"endpoints": ["http://[fe80::1]/"]}},
                               headers={**AUTH, "Content-Type": "application/merge-patch+json"})
        assert patched.status_code == 422 and "link-local address" in patched.text
    (tmp_path / "plain").mkdir()
    with make_client(tmp_path / "plain", allowed_endpoint_addresses=()) as client:
        refused = client.post("/v1/policies", json=_local(["http://localhost:8000"]), headers=AUTH)
        assert refused.status_code == 422 and "loopback address" in refused.text
        ordinary = client.post("/v1/policies", json=_local(["https://engine.prod.svc:8000"]), headers=AUTH)
        assert ordinary.status_code == 201, ordinary.text


def _routed(router: dict[str, object], min_replicas: int = 0) -> dict[str, object]:
    return {"name": "routed", "target": {"kind": "deployment", "namespace": "llm", "name": "chat"},
            "scaling": {"min_replicas": min_replicas}, "router": router}  # fmt: skip


def test_a_policy_naming_its_router_round_trips(tmp_path: Path) -> None:
    router = {"endpoints": ["http://moeslo-router.llm:8080"], "prometheus_labels": {"job": "moeslo-router"}}
    with make_client(tmp_path) as client:
        created = client.post("/v1/policies", json=_routed(router), headers=AUTH)
        assert created.status_code == 201, created.text
        stored = client.get("/v1/policies/routed").json()["policy"]
        assert stored["router"] == router and stored["scaling"]["min_replicas"] == 0
        put = client.put("/v1/policies/routed", json=stored, headers=AUTH)  # what GET gives, PUT takes
        assert put.status_code == 200, put.text
        assert client.get("/v1/policies/routed").json()["policy"]["router"] == router
        defaults = client.put("/v1/policies/routed", json=_routed({}), headers=AUTH).json()["policy"]
        assert defaults["router"] == {"endpoints": [], "prometheus_labels": {"job": "moeslo-router"}}
        gone = client.patch("/v1/policies/routed", json={"router": None}, headers=AUTH)
        assert gone.status_code == 200 and gone.json()["policy"]["router"] is None


@pytest.mark.parametrize(
    ("router", "field"),
    [
        ({"endpoints": ["http://127.0.0.1:8080"]}, "router.endpoints.0"),
        ({"endpoints": ["ftp://router"]}, "router.endpoints"),
        ({"endpoints": ["http://r:1", "http://r:1"]}, "listed twice"),
        ({"prometheus_labels": {}}, "router.prometheus_labels"),
        ({"prometheus_labels": {"job name": "x"}}, "not a Prometheus label name"),
        ({"prometheus_labels": {"job": "x\ny"}}, "no control characters"),
        ({"queue": 1}, "router.queue"),
    ],
)
def test_bad_routers_are_refused_naming_the_field(tmp_path: Path, router: dict[str, object], field: str) -> None:
    with make_client(tmp_path) as client:
        response = client.post("/v1/policies", json=_routed(router), headers=AUTH)
        assert response.status_code == 422, response.text
        assert field in response.text, response.text
