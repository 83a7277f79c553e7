"""``POST /v1/placement`` refuses a malformed body with 422 naming the field, before the engine sees it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.placement import Placement
from engine.server import create_app


class _Engine:
    """What the placement routes use of an engine client: its placement, and the swap it records."""

    def __init__(self) -> None:
        self.placement = Placement.contiguous(2, 4, 2)
        self.requested: list[Placement] = []

    def request_placement(self, placement: Placement) -> Any:
        self.requested.append(placement)
        raise AssertionError("a malformed placement reached the engine")


@pytest.fixture
def client_and_engine() -> tuple[TestClient, _Engine]:
    engine = _Engine()
    app = create_app(engine, tokenizer=None, model_name="m")  # type: ignore[arg-type]
    return TestClient(app), engine  # no lifespan: the engine is never started


@pytest.mark.parametrize(("field", "value"), [
    ("num_ranks", 0), ("num_ranks", None), ("num_ranks", "2"), ("num_ranks", 2.5), ("num_ranks", True),
    ("slots_per_rank", 0), ("slots_per_rank", 2.5), ("slots_per_rank", False),
])
def test_counts_that_are_no_whole_number_answer_422_naming_the_field(
    client_and_engine: tuple[TestClient, _Engine], field: str, value: object
) -> None:
    client, engine = client_and_engine
    body = {**engine.placement.to_json(), field: value}
    resp = client.post("/v1/placement", json=body)
    assert resp.status_code == 422, resp.text
    assert any(p.startswith(f"{field} must be a whole number >= 1") for p in resp.json()["error"]["problems"])
    assert engine.requested == []


@pytest.mark.parametrize("entry", [1.5, True, "1", None])
def test_expert_ids_that_are_no_whole_number_answer_422(
    client_and_engine: tuple[TestClient, _Engine], entry: object
) -> None:
    client, engine = client_and_engine
    rows = engine.placement.phy2log.tolist()
    rows[1][0] = entry
    resp = client.post("/v1/placement", json={"num_ranks": 2, "phy2log": rows})
    assert resp.status_code == 422, resp.text
    assert "phy2log entries must be whole numbers" in resp.text
    assert engine.requested == []


def test_an_apply_the_core_has_not_answered_in_time_is_a_503_saying_it_may_still_be_applied() -> None:
    from contracts.errors import UnavailableError

    class _Slow(_Engine):
        def request_placement(self, placement: Placement) -> Any:
            raise UnavailableError("the placement apply timed out after 300 s; it may still be applied")

    engine = _Slow()
    client = TestClient(create_app(engine, tokenizer=None, model_name="m"))  # type: ignore[arg-type]
    resp = client.post("/v1/placement", json=engine.placement.to_json())
    assert resp.status_code == 503 and "it may still be applied" in resp.json()["error"]["message"]
