"""``moeslo rebalance --load`` on what the engines serve: ``GET /v1/expert-load`` and vLLM's ``GET /moeslo/eplb``.

The documents are made by the engines' own code (the embedded engine's routing window and route body, the
vLLM plugin's status merge), saved as the runbook saves them, and planned from.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from contracts.errors import DataError
from contracts.imbalance import rank_load
from contracts.placement import Placement
from controller.rebalance.load_files import read_expert_load

LAYERS, EXPERTS, RANKS = 2, 8, 2


def routed() -> np.ndarray:
    load = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    load[0] = [40, 1, 1, 1, 30, 1, 1, 1]
    load[1] = [5, 1, 3, 2, 9, 9, 0, 4]
    return load


def engine_body(load: np.ndarray | None) -> dict[str, Any]:
    """The embedded engine's ``GET /v1/expert-load`` body after ``load`` was routed (None: nothing yet)."""
    from engine.expert_load import ExpertLoadTracker
    from engine.server import _expert_load_json
    from engine.stats import RoutingDelta

    placement = Placement.contiguous(LAYERS, EXPERTS, RANKS)
    tracker = ExpertLoadTracker(window_steps=64)
    if load is not None:
        ranks = rank_load(placement.phy2log, load.astype(np.float64), RANKS).astype(np.int64)
        tracker.add(RoutingDelta(load, ranks, steps=3))
    engine = SimpleNamespace(expert_load=tracker.snapshot, placement=placement, num_experts=EXPERTS,
                             config=SimpleNamespace(routing_window_steps=64))
    return _expert_load_json(engine)  # type: ignore[arg-type]


def vllm_body(load: np.ndarray | None) -> dict[str, Any]:
    """The vLLM plugin's ``GET /moeslo/eplb`` body: one worker's window (None: the worker counts nothing)."""
    from engine.vllm_plugin.eplb_requests import merge_status

    placement = Placement.contiguous(LAYERS, EXPERTS, RANKS)
    window = None if load is None else {
        "layer_ids": [1, 3], "expert_tokens": load.tolist(), "expert_tokens_total": (load * 5).tolist(),
        "active_flushes": 3, "rank_source": "eplb"}
    reply = {"eplb": None, "policy": None, "num_ranks": RANKS, "phy2log": placement.phy2log.tolist(),
             "placement_source": "eplb", "window": window, "placement_log": None}
    return merge_status([reply])


def rebalance(*args: str) -> tuple[int, str, str]:
    from cli.main import app

    result = CliRunner().invoke(app, ["rebalance", *args])
    return result.exit_code, result.stdout, result.output


@pytest.mark.parametrize("body", [engine_body, vllm_body])
def test_an_engines_expert_load_plans_from_its_window(tmp_path: Path, body: Any) -> None:
    load = routed()
    saved = tmp_path / "engload.json"
    saved.write_text(json.dumps(body(load)))
    # The window (expert_tokens), not the running total since the engine started.
    assert read_expert_load(saved).tolist() == load.tolist()
    out = tmp_path / "pe.json"
    code, stdout, output = rebalance("--load", str(saved), "--ranks", str(RANKS), "--slots-per-rank", "5",
                                     "--out", str(out), "--json")
    assert code == 0, output
    summary = json.loads(stdout)
    assert summary["layers"] == LAYERS and summary["active_layers"] == LAYERS
    assert summary["imbalance_after"]["cv_worst"] < summary["imbalance_before"]["cv_worst"]
    Placement.load(out).validate(num_layers=LAYERS, num_experts=EXPERTS, num_ranks=RANKS)


@pytest.mark.parametrize(("body", "message"), [
    (engine_body, "holds no routed tokens yet (steps_in_window 0)"),
    (vllm_body, '"expert_tokens" is null'),
])
def test_an_engine_that_routed_nothing_is_a_clear_error(tmp_path: Path, body: Any, message: str) -> None:
    saved = tmp_path / "empty.json"
    saved.write_text(json.dumps(body(None)))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_expert_load(saved)
    code, stdout, output = rebalance("--load", str(saved), "--ranks", str(RANKS), "--slots-per-rank", "5",
                                     "--out", str(tmp_path / "pe.json"))
    assert code == 2 and stdout == ""
    assert output.startswith("error: ") and message in output and output.count("\n") == 1
    assert not (tmp_path / "pe.json").exists()


def test_an_unknown_document_names_every_accepted_form(tmp_path: Path) -> None:
    saved = tmp_path / "other.json"
    saved.write_text('{"counts": [[1, 2]]}')
    code, _, output = rebalance("--load", str(saved), "--ranks", "2", "--slots-per-rank", "1",
                                "--out", str(tmp_path / "pe.json"))
    assert code == 2 and output.count("error:") == 1
    for form in ('"logical_count"', '"expert_tokens"', "/v1/expert-load", "/moeslo/eplb"):
        assert form in output


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_load_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"load{suffix}"
    path.write_bytes(b"1,2\n3,\xe0\n")
    with pytest.raises(DataError) as caught:
        read_expert_load(path)
    assert caught.value.path == str(path)
    assert caught.value.line == 2
    assert "not a UTF-8 text file (byte 0xe0)" in str(caught.value)
