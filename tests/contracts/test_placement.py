"""Placement construction, validation and JSON."""

from __future__ import annotations

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
    import json

    path.write_text(json.dumps(placement.to_json()))
    assert Placement.load(path) == placement
    assert Placement.from_json({"phy2log": placement.phy2log.tolist(), "slots_per_rank": 3}) == placement
    with pytest.raises(PlacementError, match="phy2log"):
        Placement.from_json({"num_ranks": 2})
    path.write_text("{not json")
    with pytest.raises(PlacementError, match="cannot read placement"):
        Placement.load(path)
