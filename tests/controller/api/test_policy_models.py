"""One policy a model over REST: the SLIs, load and alerts are read per ``model_name``, so a second policy of a
model would share the first's figures and pages; every way a policy is written refuses it."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from controller.openslo import export_policy
from controller.policy import Policy
from tests.controller.api.conftest import AUTH


def _policy(name: str, model: str = "m", **extra: Any) -> dict[str, Any]:
    return {"name": name, "target": {"kind": "model", "model": model}, **extra}


def _put(client: TestClient, name: str, model: str = "m", **extra: Any) -> Any:
    return client.put(f"/v1/policies/{name}", json=_policy(name, model, **extra), headers=AUTH)


HELD = "model 'm' is watched by policy 'team-a' already: policy 'team-b' cannot watch it too"


def test_a_put_for_a_model_another_policy_watches_is_409_naming_both(client: TestClient) -> None:
    assert _put(client, "team-a").status_code == 201
    refused = _put(client, "team-b")
    assert refused.status_code == 409, refused.text
    assert HELD in refused.json()["detail"]
    assert client.get("/v1/policies/team-b").status_code == 404
    assert _put(client, "team-a", mode="advisory").status_code == 200  # the holder itself may replace it
    # A Kubernetes target without a model watches its workload's name.
    workload = {"name": "team-b", "target": {"kind": "deployment", "namespace": "prod", "name": "m"}}
    assert client.put("/v1/policies/team-b", json=workload, headers=AUTH).status_code == 409


def test_post_and_patch_are_refused_too_and_a_model_given_up_is_free(client: TestClient) -> None:
    assert _put(client, "team-a").status_code == 201
    posted = client.post("/v1/policies", json=_policy("team-b"), headers=AUTH)
    assert posted.status_code == 409 and HELD in posted.json()["detail"]
    assert _put(client, "team-b", "n").status_code == 201
    patched = client.patch("/v1/policies/team-b", json={"target": {"model": "m"}}, headers=AUTH)
    assert patched.status_code == 409 and HELD in patched.json()["detail"]
    assert _put(client, "team-a", "o").status_code == 200  # team-a moves to another model ...
    assert client.patch("/v1/policies/team-b", json={"target": {"model": "m"}}, headers=AUTH).status_code == 200
    assert client.delete("/v1/policies/team-b", headers=AUTH).status_code == 204  # ... and a deleted one frees it
    assert _put(client, "team-c").status_code == 201


def _openslo(name: str, model: str = "m") -> str:
    return export_policy(Policy.model_validate(_policy(name, model)))


def test_an_openslo_import_of_a_held_model_is_409_and_two_new_policies_of_one_model_422(client: TestClient) -> None:
    assert _put(client, "team-a").status_code == 201
    imported = client.post("/v1/openslo", content=_openslo("team-b"), headers=AUTH)
    assert imported.status_code == 409 and HELD in imported.json()["detail"]
    both = client.post("/v1/openslo", content=_openslo("team-c", "n") + "---\n" + _openslo("team-d", "n"), headers=AUTH)
    assert both.status_code == 422, both.text
    assert "model 'n' is watched by policy 'team-c' already: policy 'team-d'" in both.json()["detail"]
    assert [item["name"] for item in client.get("/v1/policies").json()["items"]] == ["team-a"]


def _racing_put(client: TestClient, side: str, model: str, start: threading.Barrier, statuses: list[int]) -> None:
    start.wait()
    statuses.append(_put(client, f"team-{side}-{model}", model).status_code)


def test_concurrent_puts_of_one_model_under_two_names_let_one_through(client: TestClient) -> None:
    rounds = 8
    statuses: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(rounds):
        start = threading.Barrier(2)
        threads = [threading.Thread(target=_racing_put, args=(client, side, f"model-{i}", start, statuses[side]))
                   for side in statuses]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(sorted(pair) == [201, 409] for pair in zip(statuses["a"], statuses["b"], strict=True)), statuses
    assert len(client.get("/v1/policies").json()["items"]) == rounds
