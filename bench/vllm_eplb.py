"""``moeslo bench vllm-eplb``: our planner as vLLM's EPLB policy against vLLM's default policy.

Both run through vLLM 0.32's own policy interface,
``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices)``, on every SGLang DeepSeek-V3 expert-load file
(MoE layers only; read in place, never copied): vLLM's ``DefaultEplbPolicy``
as ``EPLB_POLICIES["default"]`` holds it, and ``MoesloEplbPolicy`` (what
``MOESLO_VLLM_EPLB_POLICY=1`` puts there).  Two starting points: a fresh
plan (``old=None``) and the re-plan vLLM actually asks for, from its
initial map (``[0..E-1]`` then replicas of ``0, 1, ...``), where moves (an
expert copied onto a rank that did not hold it) count too.  Figures:
max/mean rank load (layer average and worst layer), CV, balancedness,
plan time (best of ``repeat``, wall and CPU, the two policies timed in turns), and ours over vLLM's.

vLLM lives in ``.venv-vllm``: the measuring half runs there
(``python -m bench.vllm_eplb FOLDER REPEAT``) and prints JSON; without the
venv or the data the benchmark says so and skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.rebalance import expert_load_dir, load_files, timed_alternating
from contracts.imbalance import balancedness, count_replicas, imbalance_cv, max_over_mean, rank_load
from controller.rebalance.moves import rank_moves
from harness.vllm_server import VLLM_VENV, vllm_python

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CONFIGS: dict[str, dict[str, int]] = {
    "hierarchical_32ranks_4nodes_8groups_288slots": {"num_ranks": 32, "num_replicas": 288, "num_groups": 8,
                                                     "num_nodes": 4},
    "global_32ranks_1node_8groups_288slots": {"num_ranks": 32, "num_replicas": 288, "num_groups": 8, "num_nodes": 1},
}  # fmt: skip
"""DeepSeek-V3's 8 expert groups on 32 EP ranks with 32 redundant slots (vLLM passes the model's group count)."""
STARTS = ("fresh", "from_initial_map")
INNER_TIMEOUT_S = 1800.0


def initial_map(layers: int, num_experts: int, num_replicas: int) -> IntArray:
    """vLLM's map before the first rearrangement (``EplbState.build_initial_global_physical_to_logical_map``)."""
    row = np.arange(num_replicas, dtype=np.int64) % num_experts
    return np.tile(row, (layers, 1))


def figures(phy2log: IntArray, load: FloatArray, num_ranks: int) -> dict[str, float]:
    per_rank = rank_load(phy2log, load, num_ranks)
    mom = max_over_mean(per_rank)
    return {
        "max_over_mean_avg": float(mom.mean()),
        "max_over_mean_worst": float(mom.max()),
        "cv_avg": float(imbalance_cv(per_rank).mean()),
        "balancedness_avg": float(balancedness(per_rank).mean()),
    }


def check_plan(phy2log: IntArray, layers: int, num_experts: int, num_replicas: int) -> None:
    """What vLLM needs of a plan: shape, ids in range, every logical expert with a replica."""
    if phy2log.shape != (layers, num_replicas):
        raise AssertionError(f"plan shape {phy2log.shape}, expected {(layers, num_replicas)}")
    if phy2log.min() < 0 or phy2log.max() >= num_experts:
        raise AssertionError("plan holds expert ids out of range")
    if (count_replicas(phy2log, num_experts) == 0).any():
        raise AssertionError("plan leaves a logical expert without a replica")


def _run_policies(policies: dict[str, Any], load: FloatArray, config: dict[str, int], old: IntArray | None,
                  repeat: int) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each policy's plan and figures; the policies timed in turns (ABBA), so the machine's drift and first-call
    costs fall on both alike."""
    import torch

    weight = torch.from_numpy(load.astype(np.int64))  # vLLM passes integer token counts
    old_t = None if old is None else torch.from_numpy(old)

    def plan_of(policy: Any) -> Callable[[], Any]:
        return lambda: policy.rebalance_experts(weight, config["num_replicas"], config["num_groups"],
                                                config["num_nodes"], config["num_ranks"], old_t)  # fmt: skip

    times = timed_alternating({who: plan_of(policy) for who, policy in policies.items()}, repeat)
    rows: dict[str, dict[str, Any]] = {}
    for who, (plan, wall_ms, cpu_ms) in times.items():
        phy2log = np.asarray(plan.cpu().numpy(), dtype=np.int64)
        check_plan(phy2log, load.shape[0], load.shape[1], config["num_replicas"])
        out: dict[str, Any] = {**figures(phy2log, load, config["num_ranks"]), "plan_ms": wall_ms, "plan_cpu_ms": cpu_ms}
        if old is not None:
            out["moves"] = int(rank_moves(old, phy2log, config["num_ranks"]).sum())
        rows[who] = out
    return rows


def measure(folder: Path, repeat: int, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Runs inside the vLLM venv: both policies, every file, configuration and starting point."""
    from vllm.distributed.eplb.policy import DefaultEplbPolicy

    from controller.rebalance.vllm_policy import policy_class

    # DefaultEplbPolicy is what EPLB_POLICIES["default"] holds unless MOESLO_VLLM_EPLB_POLICY=1 swapped it.
    policies = {"vllm_default": DefaultEplbPolicy, "moeslo": policy_class()}
    loads = load_files(folder)
    results: dict[str, Any] = {}
    for config_name, config in CONFIGS.items():
        per_start: dict[str, Any] = {}
        for start in STARTS:
            per_file: dict[str, Any] = {}
            for name, load in loads.items():
                progress(f"{config_name} {start} {name}")
                fresh = start == "fresh"
                old = None if fresh else initial_map(load.shape[0], load.shape[1], config["num_replicas"])
                row: dict[str, Any] = _run_policies(policies, load, config, old, repeat)
                row["ratios_moeslo_over_vllm_default"] = ratios(row["moeslo"], row["vllm_default"])
                per_file[name] = row
            per_start[start] = {"per_file": per_file, "summary": summarize(per_file)}
        results[config_name] = {**config, "starts": per_start}
    return {
        "baseline": "vllm_default",
        "baseline_class": f"{policies['vllm_default'].__module__}.{policies['vllm_default'].__qualname__}",
        "interface": "EPLB_POLICIES['default'].rebalance_experts (vLLM 0.32)",
        "files": list(loads),
        "layers_x_experts": list(next(iter(loads.values())).shape),
        "repeat": repeat,
        "configurations": results,
    }


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    """Ours over vLLM's for each figure ours has; None where vLLM's is 0 (a re-plan that moved nothing)."""
    keys = [k for k in ("max_over_mean_avg", "max_over_mean_worst", "plan_ms", "plan_cpu_ms", "moves") if k in ours]
    return {key: ours[key] / theirs[key] if theirs[key] else None for key in keys}


def _range(values: list[Any]) -> list[Any] | None:
    """[min, max] of the values that are defined (None: none is)."""
    defined = [v for v in values if v is not None]
    return [min(defined), max(defined)] if defined else None


def summarize(per_file: dict[str, Any]) -> dict[str, Any]:
    rows = list(per_file.values())
    ratio_rows = [r["ratios_moeslo_over_vllm_default"] for r in rows]

    def ratio_range(key: str) -> list[Any] | None:
        return _range([r[key] for r in ratio_rows])

    def side_range(who: str, key: str) -> list[Any] | None:
        return _range([r[who][key] for r in rows])

    plan_ratio = ratio_range("plan_ms")
    out: dict[str, Any] = {
        "max_over_mean_avg_ratio_worst_file": max(r["max_over_mean_avg"] for r in ratio_rows),
        "max_over_mean_worst_layer_ratio_worst_file": max(r["max_over_mean_worst"] for r in ratio_rows),
        "plan_ms_ratio_range": plan_ratio,
        "plan_ms_moeslo_range": side_range("moeslo", "plan_ms"),
        "plan_ms_vllm_default_range": side_range("vllm_default", "plan_ms"),
    }
    if "moves" in ratio_rows[0]:
        out["moves_ratio_range"] = ratio_range("moves")
        out["moves_ratio_undefined_files"] = sum(r["moves"] is None for r in ratio_rows)
        out["moves_moeslo_range"] = side_range("moeslo", "moves")
        out["moves_vllm_default_range"] = side_range("vllm_default", "moves")
    out["goals"] = {
        "max_over_mean_at_or_below_vllm_default_every_file": all(
            r["moeslo"]["max_over_mean_avg"] <= r["vllm_default"]["max_over_mean_avg"] + 1e-12
            and r["moeslo"]["max_over_mean_worst"] <= r["vllm_default"]["max_over_mean_worst"] + 1e-12
            for r in rows
        ),
        "plan_time_at_most_tenth_of_vllm_default_every_file": plan_ratio is not None
        and all(r["plan_ms"] is not None for r in ratio_rows) and plan_ratio[1] <= 0.1,
    }
    return out


def run_vllm_eplb_bench(folder: Path | None = None, *, repeat: int = 5) -> dict[str, Any]:
    """Run :func:`measure` in the vLLM venv; a ``skipped`` reason without the venv or the data."""
    folder = folder or expert_load_dir()
    python = vllm_python()
    if python is None:
        return {"skipped": f"no vLLM venv at {VLLM_VENV} (run `make vllm-venv`)"}
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return {"skipped": f"no expert-load files in {folder}"}
    done = subprocess.run(
        [str(python), "-m", "bench.vllm_eplb", str(folder), str(repeat)],
        capture_output=True, text=True, timeout=INNER_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the vLLM side failed (exit {done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _main(argv: list[str]) -> None:
    folder, repeat = Path(argv[0]), int(argv[1])
    result = measure(folder, repeat, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result))


if __name__ == "__main__":
    _main(sys.argv[1:])
