"""A policy's replica profile over REST: a count no replica has (10**400 KV tokens) is a 422 naming the field, not
a policy the sizing advisor then fails on every tick (OverflowError)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.controller.api.conftest import AUTH

PROFILE = {"prefill_tokens_per_s": 24000.0, "itl_base_s": 0.007, "itl_per_seq_s": 0.0002, "kv_capacity_tokens": 150000}


@pytest.mark.parametrize("field", ["kv_capacity_tokens", "max_num_seqs", "prefill_chunk_tokens"])
def test_a_profile_count_past_any_replica_is_refused_naming_it(client: TestClient, field: str) -> None:
    policy = {"name": "fp", "target": {"kind": "deployment", "namespace": "prod", "name": "fp"},
              "profile": {**PROFILE, field: 10**400}}  # fmt: skip
    response = client.put("/v1/policies/fp", content=json.dumps(policy),
                          headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert response.status_code == 422, response.text
    assert [p["field"] for p in response.json()["errors"]] == [f"profile.{field}"]
    assert client.get("/v1/policies/fp").status_code == 404
