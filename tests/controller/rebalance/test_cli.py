"""``moeslo rebalance`` on good and bad load files; ``moeslo bench rebalance`` without data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import DataError
from contracts.imbalance import rank_load
from contracts.placement import Placement
from controller.rebalance.load_files import read_expert_load, read_expert_loads


def skewed_load(layers: int = 3, experts: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    load = np.round(rng.pareto(1.3, (layers, experts)) * 100)
    load[0] = 0.0  # a dense layer, as in the SGLang files
    return load


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.output


def test_sglang_json_to_a_loadable_placement(tmp_path: Path) -> None:
    load = skewed_load()
    src = tmp_path / "load.json"
    src.write_text(json.dumps({"logical_count": load.tolist()}))
    out = tmp_path / "placement.json"
    code, stdout, output = run("rebalance", "--load", str(src), "--ranks", "4", "--slots-per-rank", "5",
                               "--out", str(out), "--json")
    assert code == 0, output
    summary = json.loads(stdout)
    assert summary["active_layers"] == 2 and summary["layers"] == 3
    doc = json.loads(out.read_text())
    for key in ("phy2log", "moves", "imbalance_before", "imbalance_after", "plan_ms", "num_ranks", "slots_per_rank"):
        assert key in doc
    placement = Placement.from_json(doc)
    placement.validate(num_layers=3, num_experts=16, num_ranks=4)
    assert placement.slots_per_rank == 5
    # The dense layer keeps the contiguous layout; the others improve.
    assert np.array_equal(placement.phy2log[0], Placement.contiguous(3, 16, 4, 5).phy2log[0])
    measured = rank_load(placement.phy2log, load, 4)
    after = measured.max(axis=1)[1:] / measured.mean(axis=1)[1:]
    assert np.allclose(after, doc["imbalance_after"]["max_over_mean"][1:])
    assert doc["imbalance_after"]["summary"]["max_over_mean_worst"] <= doc["imbalance_before"]["summary"][
        "max_over_mean_worst"]
    # Every reported move is a slot whose expert changed.
    contiguous = Placement.contiguous(3, 16, 4, 5).phy2log
    for move in doc["moves"]:
        assert contiguous[move["layer"], move["slot"]] == move["from_expert"]
        assert placement.phy2log[move["layer"], move["slot"]] == move["to_expert"]
        assert move["rank"] == move["slot"] // 5


def test_replan_from_previous_and_npy_csv_inputs(tmp_path: Path) -> None:
    first, second = skewed_load(seed=1), skewed_load(seed=1) * np.linspace(0.6, 1.4, 16)
    npy = tmp_path / "first.npy"
    np.save(npy, first)
    csv = tmp_path / "second.csv"
    csv.write_text("# expert load\n" + ",".join(f"e{i}" for i in range(16)) + "\n"
                   + "\n".join(",".join(str(x) for x in row) for row in second) + "\n")
    assert np.allclose(read_expert_load(csv), second)
    start, replan = tmp_path / "start.json", tmp_path / "replan.json"
    code, _, output = run("rebalance", "--load", str(npy), "--ranks", "4", "--slots-per-rank", "5",
                          "--out", str(start))
    assert code == 0, output
    assert "max/mean" in output
    code, stdout, output = run("rebalance", "--load", str(csv), "--ranks", "4", "--slots-per-rank", "5",
                               "--previous", str(start), "--out", str(replan), "--json")
    assert code == 0, output
    doc = json.loads(replan.read_text())
    before = Placement.load(start).phy2log
    changed = int((before != np.asarray(doc["phy2log"])).sum())
    assert changed == len(doc["moves"])
    assert json.loads(stdout)["total_moves"] <= changed


def test_hierarchical_options(tmp_path: Path) -> None:
    src = tmp_path / "load.npy"
    np.save(src, skewed_load(experts=16))
    out = tmp_path / "p.json"
    code, _, output = run("rebalance", "--load", str(src), "--ranks", "4", "--slots-per-rank", "5",
                          "--nodes", "2", "--groups", "4", "--out", str(out), "--json")
    assert code == 0, output
    doc = json.loads(out.read_text())
    assert doc["mode"] == "hierarchical" and len(doc["cv_lower_bound"]) == 3
    code, _, output = run("rebalance", "--load", str(src), "--ranks", "4", "--slots-per-rank", "5",
                          "--nodes", "3", "--groups", "4", "--out", str(out))
    assert code == 2
    assert "4 ranks cannot be split evenly over 3 nodes" in output


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", '{"logical_count": [[1, 2],\n [3, }', "bad.json:2: invalid JSON"),
        ("nokey.json", '{"counts": [[1, 2]]}', '"logical_count"'),
        ("ragged.json", '{"logical_count": [[1, 2], [3]]}', "rectangular matrix"),
        ("neg.json", '{"logical_count": [[1, -2], [3, 4]]}', "1 entries are negative (first: layer 0, expert 1)"),
        ("nan.csv", "1,2\n3,nan\n", "NaN or infinite"),
        ("null.json", '{"expert_tokens": [[1, null, 2, 3]]}',
         '"expert_tokens" holds 1 entry that is not a number (first: layer 0, expert 1: null)'),
        ("str.json", '{"expert_tokens": [["1", "2"], ["3", "4"]]}',
         '"expert_tokens" holds 4 entries that are not numbers (first: layer 0, expert 0: "1")'),
        ("bool.json", '{"logical_count": [[1, 2], [true, 4]]}',
         '"logical_count" holds 1 entry that is not a number (first: layer 1, expert 0: true)'),
        ("passes.json", '{"logical_count": [[[1, 2]], [[3, {}]]]}',
         '"logical_count" holds 1 entry that is not a number (first: pass 1, layer 0, expert 1: {})'),
        ("text.csv", "1,2\n3,x\n", "text.csv:2: not a number"),
        ("short.csv", "1,2,3\n4,5\n", "short.csv:2: 2 columns, earlier rows have 3"),
        ("typo.csv", "1,2,x,4\n5,6,7,8\n", "typo.csv:1: not a number"),  # a first data row, not a header
        ("flat.json", '{"logical_count": [1, 2, 3]}', "layers x experts matrix, got shape (3,)"),
        ("load.txt", "1,2", "unknown load file type '.txt'"),
    ],
)
def test_bad_load_files_give_a_clear_error(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as err:
        read_expert_load(path)
    assert message in str(err.value)
    code, stdout, output = run("rebalance", "--load", str(path), "--ranks", "2", "--slots-per-rank", "1",
                               "--out", str(tmp_path / "out.json"), "--json")
    assert code == 2 and stdout == ""
    assert "error:" in output
    assert not (tmp_path / "out.json").exists()


def test_a_csv_with_a_byte_order_mark_keeps_its_first_row(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeff1,2\n3,4\n".encode())
    assert read_expert_load(path).tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_a_csv_headed_by_its_column_numbers_has_no_extra_layer(tmp_path: Path) -> None:
    """``pandas.DataFrame(load).to_csv(index=False)`` heads the file ``0,1,2,3``: read as layer 0, it shifted every
    layer by one.  Two columns of 0 and 1 stay a layer: that is a load someone may have recorded."""
    path = tmp_path / "pandas.csv"
    path.write_text("0,1,2,3\n5,1,1,1\n0,1,2,3\n")
    assert read_expert_load(path).tolist() == [[5.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0]]
    narrow = tmp_path / "narrow.csv"
    narrow.write_text("0,1\n3,4\n")
    assert read_expert_load(narrow).tolist() == [[0.0, 1.0], [3.0, 4.0]]


def test_bad_npy_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "s.npy"
    np.save(path, np.array([["a", "b"]]))
    with pytest.raises(DataError, match="real numbers"):
        read_expert_load(path)
    with pytest.raises(DataError, match="no such file"):
        read_expert_load(tmp_path / "absent.json")
    with pytest.raises(DataError, match="a folder, not a load file"):
        read_expert_load(tmp_path)


def test_previous_placement_that_does_not_fit(tmp_path: Path) -> None:
    src = tmp_path / "load.npy"
    np.save(src, skewed_load())
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps(Placement.contiguous(3, 16, 2, 8).to_json()))
    code, _, output = run("rebalance", "--load", str(src), "--ranks", "4", "--slots-per-rank", "5",
                          "--previous", str(prev), "--out", str(tmp_path / "o.json"))
    assert code == 2
    assert "is for 2 ranks x 8 slots per rank, not the --ranks 4 x --slots-per-rank 5 asked for" in output
    # As many slots in all: the flags were named as if the engine ran them ("the engine runs 4").
    code, _, output = run("rebalance", "--load", str(src), "--ranks", "4", "--slots-per-rank", "4",
                          "--previous", str(prev), "--out", str(tmp_path / "o.json"))
    assert code == 2 and "engine" not in output
    assert "is for 2 ranks x 8 slots per rank, not the --ranks 4 x --slots-per-rank 4 asked for" in output


def test_bench_skips_cleanly_without_data(tmp_path: Path) -> None:
    code, stdout, output = run("bench", "rebalance", "--data", str(tmp_path / "none"), "--json")
    assert code == 0, output
    assert "no expert-load files" in json.loads(stdout)["skipped"]


def test_several_load_files_are_planned_as_windows(tmp_path: Path) -> None:
    first, second = np.ones((3, 16)), np.ones((3, 16))
    first[:, :4], second[:, 8:12] = 10.0, 10.0
    paths = [tmp_path / "first.npy", tmp_path / "second.json"]
    np.save(paths[0], first)
    paths[1].write_text(json.dumps({"logical_count": second.tolist()}))
    out = tmp_path / "p.json"
    code, stdout, output = run("rebalance", "--load", str(paths[0]), "--load", str(paths[1]), "--ranks", "8",
                               "--slots-per-rank", "3", "--out", str(out), "--json")
    assert code == 0, output
    summary = json.loads(stdout)
    assert summary["windows"] == 2 and len(summary["imbalance_after_per_window"]) == 2
    assert all(w["cv_worst"] < 0.02 for w in summary["imbalance_after_per_window"])
    doc = json.loads(out.read_text())
    assert doc["load_files"] == [str(p) for p in paths]
    placement = Placement.from_json(doc)
    for load in (first, second):
        measured = rank_load(placement.phy2log, load, 8)
        assert (measured.std(axis=1) / measured.mean(axis=1)).max() < 0.02


def test_load_files_of_different_models_are_refused(tmp_path: Path) -> None:
    small, large = tmp_path / "small.npy", tmp_path / "large.npy"
    np.save(small, np.ones((2, 16)))
    np.save(large, np.ones((3, 16)))
    with pytest.raises(DataError) as err:
        read_expert_loads([small, large])
    text = str(err.value)
    assert str(small) in text and str(large) in text
    assert "3 layers x 16 experts" in text and "2 layers x 16 experts" in text
    out = tmp_path / "o.json"
    code, stdout, output = run("rebalance", "--load", str(small), "--load", str(large), "--ranks", "4",
                               "--slots-per-rank", "4", "--out", str(out), "--json")
    assert code == 2 and stdout == "" and not out.exists()
    assert "small.npy" in output and "large.npy" in output
