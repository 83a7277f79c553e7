"""Placement construction, validation and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contracts.errors import PlacementError
from contracts.placement import Placement


def test_contiguous_fills_and_replicates_in_order() -> None:
    placement = Placement.contiguous(num_layers=2, num_experts=6, num_ranks=2, slots_per_rank=4)
    assert placement.phy2log.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1]] * 2
    assert placement.experts_on_rank(0, 1).tolist() == [4, 5, 0, 1]
    assert placement.replica_counts(6)[0].tolist() == [2, 2, 1, 1, 1, 1]
    with pytest.raises(PlacementError, match="cannot hold 6 experts"):
        Placement.contiguous(1, 6, 2, 2)


def test_validation_gathers_every_problem() -> None:
    placement = Placement(np.array([[0, 0, 1], [0, 1, 1]]), 2)
    with pytest.raises(PlacementError) as info:
        placement.validate(num_layers=3, num_experts=3, num_ranks=2)
    problems = info.value.problems
    assert any("3 MoE layers" in p for p in problems)
    assert any("3 slots cannot be split evenly over 2 ranks" in p for p in problems)
    assert any("layer 0: experts 2 have no replica" in p for p in problems)


def test_json_round_trip(tmp_path: Path) -> None:
    placement = Placement.contiguous(3, 4, 2, 3)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(placement.to_json()))
    assert Placement.load(path) == placement
    assert Placement.from_json({"phy2log": placement.phy2log.tolist(), "slots_per_rank": 3}) == placement
    with pytest.raises(PlacementError, match="phy2log"):
        Placement.from_json({"num_ranks": 2})
    path.write_text("{not json")
    with pytest.raises(PlacementError, match="cannot read placement"):
        Placement.load(path)


ROWS = [[0, 1, 2, 3], [3, 2, 1, 0]]


@pytest.mark.parametrize("value", [0, -2, None, "2", 2.5, 2.0, True, [2], {"n": 2}])
@pytest.mark.parametrize("field", ["num_ranks", "slots_per_rank"])
def test_from_json_refuses_counts_that_are_no_whole_number_of_at_least_one(field: str, value: object) -> None:
    with pytest.raises(PlacementError) as err:
        Placement.from_json({"phy2log": ROWS, field: value})
    assert err.value.problems == (f"{field} must be a whole number >= 1, got {json.dumps(value)}",)


@pytest.mark.parametrize("entry", [1.5, 1.0, True, "1", None])
def test_from_json_refuses_expert_ids_that_are_no_whole_number(entry: object) -> None:
    with pytest.raises(PlacementError, match=r"phy2log entries must be whole numbers \(expert ids\), got "):
        Placement.from_json({"phy2log": [[0, 1, 2, 3], [3, 2, entry, 0]], "num_ranks": 2})


@pytest.mark.parametrize("phy2log", [[], [[]], [0, 1], [[0, 1], [0]], "0,1", None, [[0, 1], None]])
def test_from_json_refuses_a_phy2log_that_is_no_matrix(phy2log: object) -> None:
    with pytest.raises(PlacementError, match="phy2log"):
        Placement.from_json({"phy2log": phy2log, "num_ranks": 1})


def test_from_json_gathers_every_problem_and_checks_the_counts_agree() -> None:
    with pytest.raises(PlacementError) as err:
        Placement.from_json({"phy2log": [[0, 0.5]], "num_ranks": "2", "slots_per_rank": None})
    assert len(err.value.problems) == 3
    with pytest.raises(PlacementError, match="num_ranks 2 x slots_per_rank 3 is not phy2log's 4 slots per layer"):
        Placement.from_json({"phy2log": ROWS, "num_ranks": 2, "slots_per_rank": 3})
    with pytest.raises(PlacementError, match="slots_per_rank 3 does not divide phy2log's 4 slots per layer"):
        Placement.from_json({"phy2log": ROWS, "slots_per_rank": 3})
    with pytest.raises(PlacementError, match="must be an object"):
        Placement.from_json([ROWS])  # type: ignore[arg-type]
    assert Placement.from_json({"phy2log": ROWS, "num_ranks": 2, "slots_per_rank": 2}).num_ranks == 2
    assert Placement.from_json({"phy2log": np.array(ROWS), "num_ranks": np.int64(2)}).num_ranks == 2
