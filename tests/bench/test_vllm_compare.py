"""``moeslo bench vllm``: our engine against vLLM (plugin off) in paired rounds, beside that one server only."""

from __future__ import annotations

import contextlib
import inspect
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bench.vllm as bv
from bench.vllm_overhead import OverheadOptions
from harness import loadgen


class _World:
    """Which servers are up, and every round measured with the servers up at the time."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.log: list[tuple[str, list[str]]] = []
        self.sleeps: list[float] = []


def _stub(monkeypatch: pytest.MonkeyPatch, world: _World, tokens_per_s: dict[str, list[float]]) -> None:
    class Server:
        def __init__(self, checkpoint: Path, env: dict[str, str] | None = None, **kwargs: Any) -> None:
            self.name = "vllm_on" if env else "vllm_off"
            self.proc = types.SimpleNamespace(pid=1)
            self.base_url, self.model_name = self.name, "m"

        def start(self) -> None:
            world.alive.add(self.name)

        def wait_healthy(self, timeout_s: float) -> None:
            return None

        def stop(self) -> None:
            world.alive.discard(self.name)

    @contextlib.contextmanager
    def ours(checkpoint: Path, options: bv.VllmBenchOptions, vocab: int) -> Iterator[str]:
        world.alive.add("moeslo")
        try:
            yield "moeslo"
        finally:
            world.alive.discard("moeslo")

    def measure(base_url: str, model: str, options: bv.VllmBenchOptions, vocab: int, seed: int) -> dict[str, Any]:
        world.log.append((base_url, sorted(world.alive)))
        series = tokens_per_s.get(base_url, [512.0])
        tps = series[sum(who == base_url for who, _ in world.log) - 1] if len(series) > 1 else series[0]
        return {"wall_s": 512.0 / tps, "output_tokens": 512, "output_tokens_per_s": tps, "ttft_p50_s": 0.2,
                "ttft_p99_s": 0.3, "itl_p50_s": 10.0 / tps, "itl_p99_s": 0.02}  # fmt: skip

    clock = iter(range(10**6))
    monkeypatch.setattr(bv, "VllmServer", Server)
    monkeypatch.setattr(bv, "_ours_server", ours)
    monkeypatch.setattr(bv, "measure_round", measure)
    monkeypatch.setattr(bv, "vllm_python", lambda: "python")
    monkeypatch.setattr(bv, "warm_up", lambda *args: None)
    monkeypatch.setattr(bv, "tree_cpu_s", lambda pid: float(next(clock)))
    monkeypatch.setattr(bv, "_expert_tokens_published", lambda url: 0.0)
    monkeypatch.setattr(bv, "time", types.SimpleNamespace(sleep=world.sleeps.append, monotonic=lambda: 0.0))
    monkeypatch.setattr(bv, "capture_cost_us", lambda: {"tokens_16": 1.0, "tokens_3184": 2.0})
    monkeypatch.setattr(bv, "machine", lambda: {})


def _run(tmp_path: Path, repeats: int) -> dict[str, Any]:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100, "num_experts_per_tok": 4,
                                                      "num_hidden_layers": 4}))  # fmt: skip
    options = bv.VllmBenchOptions(checkpoint=tmp_path, repeats=repeats,
                                  overhead=OverheadOptions(min_pairs=2, max_pairs=2))  # fmt: skip
    return bv.run_vllm_bench(options)


def test_ours_and_vllm_take_turns_beside_the_plugin_off_server_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = _World()
    _stub(monkeypatch, world, {})
    out = _run(tmp_path, repeats=4)
    overhead = world.log[:4]
    assert all(up == ["vllm_off", "vllm_on"] for _, up in overhead)  # the plugin's pairs: both vLLM servers
    comparison = world.log[4:]
    assert [who for who, _ in comparison] == ["vllm_off", "moeslo", "moeslo", "vllm_off"] * 2  # ABBA
    assert all(up == ["moeslo", "vllm_off"] for _, up in comparison)  # the same servers up for both
    assert out["comparison"]["rounds"] == 4 and out["comparison"]["orders"][1] == ["moeslo", "vllm_plugin_off"]
    assert world.sleeps.count(bv.VllmBenchOptions().settle_s) == 8  # each comparison round waits for quiet
    assert world.alive == set()


def test_ours_over_vllm_is_the_median_of_paired_rounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    world = _World()
    # Ours is 0.9x vLLM in every round; vLLM's fastest round (300) pairs with ours' fastest (270).
    vllm = [512.0, 512.0, 100.0, 300.0, 100.0, 100.0]  # two overhead rounds first, then four compared
    _stub(monkeypatch, world, {"vllm_off": vllm, "moeslo": [90.0, 270.0, 90.0, 90.0]})
    out = _run(tmp_path, repeats=4)
    paired = out["moeslo_over_vllm_tokens_per_s_paired"]
    assert paired == {"median": pytest.approx(0.9), "min": pytest.approx(0.9), "max": pytest.approx(0.9), "rounds": 4}
    assert out["moeslo_itl_p50_over_vllm_paired"]["median"] == pytest.approx(1 / 0.9)
    assert "moeslo_over_vllm_tokens_per_s" not in out  # the unpaired best-of figure is gone
    assert out["comparison"]["moeslo"]["rounds"] == out["comparison"]["vllm_plugin_off"]["rounds"] == 4


def test_the_warm_up_sends_other_prompts_than_any_round(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    warm_up, default_seed = bv.warm_up, inspect.signature(loadgen.run_load).parameters["seed"].default
    _stub(monkeypatch, _World(), {})
    rounds: list[int] = []
    measure = bv.measure_round

    def measure_recorded(base_url: str, model: str, options: bv.VllmBenchOptions, vocab: int, seed: int) -> Any:
        rounds.append(seed)
        return measure(base_url, model, options, vocab, seed)

    monkeypatch.setattr(bv, "measure_round", measure_recorded)
    _run(tmp_path, repeats=4)
    warm: list[int] = []

    async def run_load(base_url: str, plan: list[Any], **kwargs: Any) -> list[Any]:
        warm.append(kwargs.get("seed", default_seed))
        return []

    monkeypatch.setattr(bv, "run_load", run_load)
    warm_up("vllm_off", "m", 100)
    assert 0 in rounds and warm and not set(warm) & set(rounds)
