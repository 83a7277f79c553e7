"""A policy's decision log belongs to the policy, not to its name: deleted and created again, it starts empty.

Versions grow across a delete (the new policy's first version is above every old one), and every decision is
logged with the version it was made under, so the log of a name reads the decisions of its latest creation:
on ``/v1/decisions?policy=``, ``/v1/status`` and the status page.  The whole log (``/v1/decisions``) keeps
everything, each decision with its ``policy_version``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import DecisionRecord, Store
from tests.controller.api.conftest import AUTH, TOKEN
from tests.controller.api.page.fakes import View

POLICY = {"name": "qwen", "target": {"kind": "model", "model": "m"}}


def _decision(version: int, detail: str) -> DecisionRecord:
    return DecisionRecord(
        policy="qwen", policy_version=version, at=datetime.now(UTC), tick_s=0.0, action="scale_up",
        reason="queue_depth", current_replicas=2, desired_replicas=3, mode="enforce", outcome="applied",
        detail=detail, inputs={"request_rate_rps": 5.0, "reasons": ["scale_up", "queue_depth"]},
    )


def _details(client: TestClient, **params: Any) -> list[str]:
    items = client.get("/v1/decisions", params={"limit": 100, **params}).json()["items"]
    return [item["detail"] for item in items]


def _status_details(client: TestClient) -> list[str]:
    return [d["detail"] for d in client.get("/v1/status/qwen").json()["last_decisions"]]


def _charted(page: str) -> int:
    """How many decisions the status page's replica chart draws."""
    found = re.search(r'<path [^>]*data-series="current" data-n="([0-9]+)"', page)
    assert found is not None, page
    return int(found.group(1))


def test_a_policy_deleted_and_created_again_starts_with_an_empty_log(tmp_path: Path) -> None:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    store = Store(settings.db_url)
    with TestClient(create_app(settings, store, service=View())) as client:
        assert client.post("/v1/policies", json=POLICY, headers=AUTH).json()["version"] == 1
        store.append_decisions([_decision(1, "old scale-up 1"), _decision(1, "old scale-up 2")])
        assert _details(client, policy="qwen") == ["old scale-up 2", "old scale-up 1"]
        assert _status_details(client) == ["old scale-up 2", "old scale-up 1"]
        page = client.get("/ui/policies/qwen").text
        assert "old scale-up 2" in page and _charted(page) == 2

        assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 204
        # Deleted and not created again: its log can still be read.
        assert _details(client, policy="qwen") == ["old scale-up 2", "old scale-up 1"]

        assert client.post("/v1/policies", json=POLICY, headers=AUTH).json()["version"] == 3
        assert _details(client, policy="qwen") == []
        assert _status_details(client) == []
        assert "old scale-up" not in client.get("/ui/policies/qwen").text
        # A tick that read the old policy before the delete, and logs after the new one exists: not the new one's.
        store.append_decisions([_decision(1, "old, logged late")])
        store.append_decisions([_decision(3, "new scale-up")])
        assert _details(client, policy="qwen") == ["new scale-up"]
        assert _status_details(client) == ["new scale-up"]
        page = client.get("/ui/policies/qwen").text
        assert "new scale-up" in page and "old scale-up" not in page and "logged late" not in page
        assert _charted(page) == 1  # the page's charts too, though it had read the old log before
        # The whole log keeps everything, each decision with the version it was made under.
        everything = client.get("/v1/decisions", params={"limit": 100}).json()["items"]
        assert [(d["detail"], d["policy_version"]) for d in everything] == [
            ("new scale-up", 3), ("old, logged late", 1), ("old scale-up 2", 1), ("old scale-up 1", 1),
        ]
    store.close()


def test_a_policy_deleted_through_another_replica_starts_empty_on_this_ones_page(tmp_path: Path) -> None:
    # Two controller replicas share the database; the delete went through the other one, so this one's page
    # still holds the old series until the policy is created again here.
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    store = Store(settings.db_url)
    with TestClient(create_app(settings, store, service=View())) as client:
        client.post("/v1/policies", json=POLICY, headers=AUTH)
        store.append_decisions([_decision(1, "old scale-up 1"), _decision(1, "old scale-up 2")])
        assert _charted(client.get("/ui/policies/qwen").text) == 2
        other = Store(settings.db_url)  # the other replica's
        other.delete_policy("qwen")
        other.close()
        assert client.put("/v1/policies/qwen", json=POLICY, headers=AUTH).status_code == 201
        store.append_decisions([_decision(3, "new scale-up")])
        page = client.get("/ui/policies/qwen").text
        assert _charted(page) == 1 and "old scale-up" not in page
    store.close()
