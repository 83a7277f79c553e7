"""``moeslo bench rebalance`` on expert-load files of models other than DeepSeek-V3, and of mixed shapes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.rebalance import CONFIGS, BenchConfig, _renumber_ranks, configs_for, eplb_plan, load_files
from bench.rebalance_oos import run_all
from contracts.errors import DataError
from controller.rebalance.moves import rank_moves


def _write(folder: Path, name: str, matrix: np.ndarray) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"logical_count": matrix.tolist()}))


def _skewed(layers: int, experts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(rng.lognormal(0.0, 1.0, size=(layers, experts)) * 100.0)


def test_the_layouts_are_deepseeks_for_256_experts_and_hold_every_expert_elsewhere() -> None:
    assert [(c.num_ranks, c.slots_per_rank, c.num_nodes, c.num_groups) for c in CONFIGS] == [
        (32, 9, 1, 1), (64, 5, 1, 1), (32, 8, 1, 1), (32, 9, 4, 8)
    ]  # fmt: skip
    for experts in (8, 60, 64, 128, 160, 384):
        layouts = configs_for(experts)
        assert layouts and all(c.num_slots >= experts and c.num_ranks <= experts for c in layouts), experts
        assert all(experts % c.num_groups == 0 and c.num_ranks % c.num_nodes == 0 for c in layouts), experts
    assert [c.num_slots for c in configs_for(384)] == [416, 448, 384, 416]  # Kimi K2's 384 experts
    assert all(c.num_groups == 1 for c in configs_for(60))  # 60 experts form no 8 equal groups


def test_eplbs_plan_is_renumbered_node_first_as_ours_is() -> None:
    # The same EPLB plan with its nodes numbered otherwise: renumbering whole nodes, then ranks, moves nothing.
    config = BenchConfig("hierarchical", num_ranks=8, slots_per_rank=3, num_nodes=4, num_groups=8)
    new = eplb_plan(np.random.default_rng(0).gamma(0.7, 100.0, size=(3, 16)), config)
    previous = new.reshape(3, 4, -1)[:, [1, 0, 3, 2], :].reshape(3, -1)
    assert rank_moves(previous, new, config.num_ranks).sum() > 0
    assert rank_moves(previous, _renumber_ranks(previous, new, config), config.num_ranks).sum() == 0


def test_files_of_two_models_are_refused_naming_both(tmp_path: Path) -> None:
    _write(tmp_path, "a", _skewed(4, 64, 0))
    _write(tmp_path, "b", _skewed(6, 128, 1))
    with pytest.raises(DataError, match="every load file must describe the same model") as caught:
        load_files(tmp_path)
    assert "a.json" in str(caught.value) and "b.json" in str(caught.value)


def test_layers_stay_aligned_when_one_file_has_an_idle_layer(tmp_path: Path) -> None:
    loads = [_skewed(5, 16, seed) for seed in range(3)]
    for matrix in loads:
        matrix[0] = 0.0  # a dense layer: no load in any file
    loads[1][3] = 0.0  # a MoE layer that one workload left idle
    for i, matrix in enumerate(loads):
        _write(tmp_path, f"w{i}", matrix)
    read = load_files(tmp_path)
    assert [m.shape for m in read.values()] == [(4, 16)] * 3
    np.testing.assert_array_equal(read["w0"], loads[0][1:])
    np.testing.assert_array_equal(read["w1"][2], 0.0)  # layer 3 is still layer 3 of every file


def test_the_bench_runs_on_a_model_with_64_experts(tmp_path: Path) -> None:
    for i in range(3):
        _write(tmp_path, f"prefill_w{i}", _skewed(3, 64, i))
    result = run_all(tmp_path, repeat=1, out_of_sample_only=True)
    layouts = result["out_of_sample"]["configurations"]
    assert list(layouts) == [c.name for c in configs_for(64)]
    for layout in layouts.values():
        per_file = layout["leave_one_out"]["per_file"]
        assert len(per_file) == 3
        assert all(entry["ours"]["max_over_mean_avg"] >= 1.0 for entry in per_file.values())


class _Clock:
    """A fake clock for the bench's timings: only the planners' stubbed delays move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.now


def _slowed(clock: _Clock, calls: list[str], who: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    delays = itertools.cycle([0.150, 0.050, 0.100])  # the same sequence for both planners

    def slowed(*args: Any, **kwargs: Any) -> Any:
        calls.append(who)
        clock.now += next(delays)
        return fn(*args, **kwargs)

    return slowed


def test_both_planners_are_timed_alike_in_sample_and_out_of_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.eplb_reference as reference
    import bench.rebalance as rb
    import bench.rebalance_oos as oos

    clock, calls = _Clock(), []
    monkeypatch.setattr(rb, "time", clock)
    monkeypatch.setattr(rb, "plan_rebalance", _slowed(clock, calls, "ours", rb.plan_rebalance))
    monkeypatch.setattr(oos, "_ours", _slowed(clock, calls, "ours", oos._ours))
    monkeypatch.setattr(reference, "rebalance_experts", _slowed(clock, calls, "eplb", reference.rebalance_experts))
    loads = {f"w{i}": _skewed(2, 16, i) for i in range(3)}
    config = configs_for(16)[0]
    row = rb._bench_file(loads["w0"], config, repeat=3)
    assert calls == ["ours", "eplb", "eplb", "ours", "ours", "eplb"]  # alternating, as often each
    assert row["ours"]["plan_ms"] == row["eplb"]["plan_ms"] == pytest.approx(50.0)  # best of three each
    calls.clear()
    per_file = oos.leave_one_out(loads, config, repeat=3)["per_file"]
    # Per file: the timed turns, then EPLB once more (untimed) on the files' mean shares.
    assert calls[:7] == ["ours", "eplb", "eplb", "ours", "ours", "eplb", "eplb"] and len(calls) == 21
    for row in per_file.values():  # the median of the same three delays each
        assert row["ours"]["plan_ms"] == row["eplb_summed"]["plan_ms"] == pytest.approx(100.0)
        assert row["plan_time_ratio"] == pytest.approx(1.0) and row["plan_cpu_time_ratio"] == pytest.approx(1.0)
