"""``moeslo bench serve``: exporters off and on in alternating order, compared round by round."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import bench.serve as bs
from bench.serve import _best_round, _paired_ratios, _pooled_itl, _run_rounds
from harness import loadgen
from harness.loadgen import LoadRequest


def _run(tokens_per_s: float, itl_p99_ms: float) -> dict[str, Any]:
    return {"load": {"output_tokens_per_s": tokens_per_s, "ttft_p99_s": 0.05, "itl_p99_s": itl_p99_ms / 1000,
                     "itl_p50_s": 0.0067}}  # fmt: skip


def test_rounds_alternate_which_variant_runs_first() -> None:
    calls: list[str] = []

    def run_one(name: str, exporters: bool) -> dict[str, Any]:
        calls.append(name)
        assert exporters == (name == "exporters_on")
        return _run(9.0, 10.0)

    rounds = _run_rounds(run_one, 3, skip_baseline=False, progress=lambda _: None)
    assert calls == ["exporters_off", "exporters_on", "exporters_on", "exporters_off", "exporters_off", "exporters_on"]
    assert [r["order"] for r in rounds] == [["exporters_off", "exporters_on"], ["exporters_on", "exporters_off"],
                                            ["exporters_off", "exporters_on"]]  # fmt: skip
    calls.clear()
    _run_rounds(run_one, 2, skip_baseline=True, progress=lambda _: None)
    assert calls == ["exporters_on", "exporters_on"]


def test_on_against_off_is_paired_within_each_round() -> None:
    # Every round: exporters on is 3 ms worse than off in the same round; the best rounds of each
    # (by throughput) are different rounds, whose difference would read -1 ms.
    rounds = [{"exporters_off": _run(9.00, 10.0), "exporters_on": _run(9.20, 13.0)},
              {"exporters_off": _run(9.30, 14.0), "exporters_on": _run(9.10, 17.0)},
              {"exporters_off": _run(9.10, 12.0), "exporters_on": _run(9.00, 15.0)}]  # fmt: skip
    paired = _paired_ratios(rounds)
    assert paired is not None
    assert paired["itl_p99_on_minus_off_ms"] == {"median": 3.0, "min": 3.0, "max": 3.0, "rounds": 3}
    tput = paired["throughput_on_over_off"]
    assert tput["min"] == round(9.10 / 9.30, 4) and tput["max"] == round(9.20 / 9.00, 4)
    assert tput["median"] == round(9.00 / 9.10, 4)
    assert _paired_ratios([{"exporters_on": _run(9.0, 10.0)}]) is None  # no baseline: no ratios


def _gaps(ms: float, tail_ms: float, n: int = 1000) -> dict[str, Any]:
    """A run whose token gaps are ``ms`` but for its slowest 2 %, at ``tail_ms``."""
    tail = n // 50
    return {**_run(9.0, tail_ms), "itls_s": [ms / 1000] * (n - tail) + [tail_ms / 1000] * tail}


def test_the_pooled_itl_p99_compares_every_rounds_gaps_with_an_interval_over_rounds() -> None:
    # Rounds at different levels (the machine's load), exporters on 0.5 ms worse in each: pooled, the difference
    # reads 0.5 ms and every resample of whole rounds keeps it; a per-round p99 would not see the pairing.
    rounds = [{"exporters_off": _gaps(5, 10.0 + k), "exporters_on": _gaps(5, 10.5 + k)} for k in (0, 3, 6)]
    pooled = _pooled_itl(rounds)
    assert pooled is not None
    assert pooled["itl_p99_on_minus_off_ms"] == 0.5 and pooled["rounds"] == 3
    lo, hi = pooled["bootstrap_5_95_ms"]
    assert 0.0 < lo <= 0.5 <= hi < 1.0
    assert pooled["token_gaps"] == {"on": 3000, "off": 3000}
    # One round where on is far worse widens the interval past it.
    rounds.append({"exporters_off": _gaps(5, 10.0), "exporters_on": _gaps(5, 20.0)})
    pooled = _pooled_itl(rounds)
    assert pooled is not None and pooled["bootstrap_5_95_ms"][1] > 5.0
    assert _pooled_itl([{"exporters_on": _gaps(5, 10.0)}]) is None  # no baseline
    assert "itls_s" not in _best_round([_gaps(5, 10.0)])  # the raw gaps are not printed


def test_the_warm_up_sends_other_prompts_than_the_measured_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []
    default_seed = inspect.signature(loadgen.run_load).parameters["seed"].default

    async def run_load(base: str, plan: list[Any], **kwargs: Any) -> list[Any]:
        seeds.append(kwargs.get("seed", default_seed))
        return []

    class _Stub:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.pid = 0

        def start(self) -> None:
            return None

        def stop(self) -> list[Any]:
            return []

    monkeypatch.setattr(bs, "run_load", run_load)
    monkeypatch.setattr(bs.subprocess, "Popen", _Stub)
    monkeypatch.setattr(bs.psutil, "Process", _Stub)
    monkeypatch.setattr(bs, "_RssSampler", _Stub)
    monkeypatch.setattr(bs, "_rss", lambda proc: 0)
    monkeypatch.setattr(bs, "wait_healthy", lambda *args, **kwargs: None)
    monkeypatch.setattr(bs, "stop_process", lambda proc: None)
    plan = [LoadRequest(arrival_s=0.0, prompt_tokens=32, max_tokens=4)] * 6
    bs._run_once(Path("/unused"), plan, 100, bs.ServeBenchOptions(), exporters=False)
    assert len(seeds) == 2 and seeds[0] != seeds[1]
