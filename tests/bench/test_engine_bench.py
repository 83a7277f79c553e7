"""``moeslo bench engine``: the baseline gets the CPUs our engine uses, and a warm-up as ours does."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import bench.engine as be
from engine.executors import ExecutorOptions


class _Model:
    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> _Model:
        return cls()

    def eval(self) -> _Model:
        return self


class _Executor:
    config = types.SimpleNamespace(vocab_size=100)

    def set_routing_stats(self, on: bool) -> None:
        return None

    def shutdown(self) -> None:
        return None


def _bench(monkeypatch: pytest.MonkeyPatch, cpus: int, **kwargs: Any) -> tuple[dict[str, Any], list[str], list[Any]]:
    """One batch-1 run of two rounds on a machine of ``cpus`` CPUs, every engine stubbed: (result, calls, options)."""
    fake = types.ModuleType("transformers")
    fake.Qwen3MoeForCausalLM = _Model  # type: ignore[attr-defined]
    fake.logging = types.SimpleNamespace(set_verbosity_error=lambda: None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    calls: list[str] = []
    created: list[ExecutorOptions] = []
    times = be.RunTimes(1.0, 1.0, 10, 32, 1, cpu_s=1.0)

    def create(options: ExecutorOptions) -> _Executor:
        created.append(options)
        torch.set_num_threads(1)  # as an executor sets its own (torch's setting is per process)
        return _Executor()

    def transformers_generate(model: Any, prompts: list[list[int]], new: int) -> Any:
        calls.append(f"transformers {len(prompts[0])} tokens on {torch.get_num_threads()} threads")
        return times, [[1]]

    def ours_generate(executor: Any, prompts: list[list[int]], new: int) -> Any:
        calls.append(f"ours {len(prompts[0])} tokens")
        return times, [[1]]

    monkeypatch.setattr(be, "default_threads", lambda ranks: max(1, cpus // ranks))
    monkeypatch.setattr(be, "create_executor", create)
    monkeypatch.setattr(be, "transformers_generate", transformers_generate)
    monkeypatch.setattr(be, "ours_generate", ours_generate)
    monkeypatch.setattr(be, "kv_mb_needed", lambda *args: 1.0)
    monkeypatch.setattr(be, "stats_direct_cost_us", lambda *args: 1.0)
    threads = torch.get_num_threads()
    try:
        result = be.run(Path("/unused"), batches=(1,), prompt_len=8, repeats=2, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return result, calls, created


@pytest.mark.parametrize(("ep", "colocate", "per_rank", "ranks"), [(1, False, 4, 1), (2, False, 2, 2),
                                                                   (2, True, 4, 1)])  # fmt: skip
def test_transformers_gets_the_threads_our_ranks_use_together(
    monkeypatch: pytest.MonkeyPatch, ep: int, colocate: bool, per_rank: int, ranks: int
) -> None:
    result, calls, created = _bench(monkeypatch, 4, ep=ep, colocate_ranks=colocate)
    assert created[0].threads_per_rank == per_rank
    assert result["moeslo_threads"] == {"per_rank": per_rank, "ranks": ranks, "total": 4}
    assert result["transformers_threads"] == 4
    assert all(c.endswith("on 4 threads") for c in calls if c.startswith("transformers"))


def test_the_baseline_gets_no_more_threads_than_cpus_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    one_cpu, _, _ = _bench(monkeypatch, 1, ep=2)  # two rank processes of one thread share the one CPU
    assert one_cpu["moeslo_threads"]["total"] == 2 and one_cpu["transformers_threads"] == 1
    asked, _, _ = _bench(monkeypatch, 1, ep=2, threads=3)
    assert asked["moeslo_threads"] == {"per_rank": 3, "ranks": 2, "total": 6} and asked["transformers_threads"] == 6


def test_both_engines_get_an_untimed_warm_up_before_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    _, calls, _ = _bench(monkeypatch, 2)
    assert sorted(calls[:2]) == ["ours 16 tokens", "transformers 16 tokens on 2 threads"]
    assert calls[2:] == ["transformers 8 tokens on 2 threads", "ours 8 tokens", "ours 8 tokens"] * 2


class _RankedExecutor:
    """An executor whose work is done by a child process, as rank processes do it without colocated ranks."""

    block_size, num_blocks = 16, 8

    def execute(self, plan: Any) -> torch.Tensor:
        time.sleep(0.1)  # this process waits on the child for the step
        return torch.zeros(len(plan.chunks), 4)


class _RankedModel:
    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        time.sleep(0.1)

    def generate(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        time.sleep(0.2)
        return torch.zeros(ids.shape[0], ids.shape[1] + kwargs["max_new_tokens"], dtype=torch.long)


def test_cpu_time_counts_the_child_processes_that_do_the_work() -> None:
    rank = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ours, _ = be.ours_generate(_RankedExecutor(), [[1, 2]], 3)  # type: ignore[arg-type]
        theirs, _ = be.transformers_generate(_RankedModel(), [[1, 2]], 3)
    finally:
        rank.kill()
        rank.wait()
    # The child spins through each run (0.3 s and 0.2 s after the prefill's share); this process sleeps.
    assert ours.cpu_s > 0.1 and theirs.cpu_s > 0.05
