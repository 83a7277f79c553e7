"""Pipeline stages of one vLLM engine: one across-layer summary over all its stages' layers, on both routes."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from engine.vllm_plugin import ExpertLoadSnapshot, SnapshotBuilder
from exporters.vllm_metrics import snapshot_families
from exporters.vllm_placement import placement_families

ROOT = Path(__file__).resolve().parents[2]


def stage(layers: tuple[int, ...], window: list[list[float]]) -> ExpertLoadSnapshot:
    """One stage's snapshot: engine 0 of model m, its own model layers."""
    return ExpertLoadSnapshot(model_name="m", engine="0", layer_ids=layers,
                              expert_tokens_total=np.ones((len(layers), 4), dtype=np.int64),
                              rank_tokens_total=np.ones(2), window_rank_tokens=np.asarray(window, dtype=float),
                              rank_source="virtual")  # fmt: skip


# Stage 0 runs model layers 1 and 3 (balanced, CV 0), stage 1 layers 5 and 7 (CV 0.9 and 0.5).
BALANCED = stage((1, 3), [[10, 10], [10, 10]])
SKEWED = stage((5, 7), [[19, 1], [15, 5]])


def test_the_snapshot_route_serves_one_summary_over_every_stage() -> None:
    """Each stage's summary went out under the same labels: duplicate series, which Prometheus refuses."""

    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(snapshot_families([BALANCED, SKEWED]))

    registry = CollectorRegistry()
    registry.register(Collector())
    lines = [line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")]
    series = collections.Counter(line.rsplit(" ", 1)[0] for line in lines)
    assert [name for name, n in series.items() if n > 1] == []
    cv = {line.split('stat="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
          for line in lines if line.startswith("moe_imbalance_cv_across_layers")}  # fmt: skip
    assert cv == pytest.approx({"min": 0.0, "median": 0.25, "max": 0.9})


STAGE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from engine.vllm_plugin import ExpertLoadSnapshot
    from exporters.vllm_metrics import make_sink

    layers, window = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    make_sink().publish(ExpertLoadSnapshot(model_name="m", engine="0", layer_ids=tuple(layers),
        expert_tokens_total=np.ones((len(layers), 4), dtype=np.int64), rank_tokens_total=np.ones(2),
        window_rank_tokens=np.asarray(window, dtype=float), rank_source="virtual"))
    """
)


def test_the_multiprocess_route_summarises_every_stage_whichever_wrote_last(tmp_path: Path) -> None:
    """Gauges of one label set are served from the latest write (``mostrecent``): the last stage's own layers."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for snap in (SKEWED, BALANCED):  # two worker processes, the balanced stage last
        args = [json.dumps(list(snap.layer_ids)), json.dumps(snap.window_rank_tokens.tolist())]
        done = subprocess.run([sys.executable, "-c", STAGE_SCRIPT, *args], env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    cv = {s.labels["stat"]: s.value for family in registry.collect() for s in family.samples
          if s.name == "moe_imbalance_cv_across_layers"}  # fmt: skip
    assert cv == pytest.approx({"min": 0.0, "median": 0.25, "max": 0.9})


def contiguous(layers: int) -> np.ndarray:
    """(layers, 4 experts, 2 ranks): experts 0-1 on rank 0, 2-3 on rank 1."""
    weights = np.zeros((layers, 4, 2))
    weights[:, :2, 0] = weights[:, 2:, 1] = 1.0
    return weights


def rearranged_stage(layers: tuple[int, ...], swapped: int, *, first: bool) -> ExpertLoadSnapshot:
    """A stage's snapshot after EPLB's rearrangement swapped the ranks of its first ``swapped`` layers (each
    layer's 4 experts land on a rank that did not hold them: 4 replicas moved per layer)."""
    weights = contiguous(len(layers))
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=layers, window_flushes=60,
                              rank_weights=lambda: (weights.copy(), "eplb"))  # fmt: skip
    builder.records_placement = first  # as the Flusher sets it: pipeline rank 0 only
    counts = np.ones((len(layers), 4), dtype=np.int64)
    builder.build(counts)
    weights[:swapped] = weights[:swapped, :, ::-1]
    return builder.build(counts * 2)


def pp_placement() -> list[ExpertLoadSnapshot]:
    """One rearrangement of a two-stage engine: stage 0 moves 8 replicas, stage 1 moves 4."""
    return [rearranged_stage((1, 3), 2, first=True), rearranged_stage((5, 7), 1, first=False)]


PLACEMENT_SERIES = ("moe_placement_swaps_total", "moe_placement_experts_moved_total",
                    "moe_placement_swap_duration_seconds_count")  # fmt: skip


def test_the_snapshot_route_serves_one_placement_series_per_engine_moves_summed_over_stages() -> None:
    """Each stage moves its own layers' experts; the rearrangement itself is one, whichever stages saw it."""

    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(placement_families(pp_placement()))

    registry = CollectorRegistry()
    registry.register(Collector())
    lines = [line for line in generate_latest(registry).decode().splitlines() if line.startswith(PLACEMENT_SERIES)]
    assert len(lines) == len({line.rsplit(" ", 1)[0] for line in lines})  # no duplicate series
    base = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("moe_placement_experts_moved_total", base) == 12
    assert registry.get_sample_value("moe_placement_swaps_total", base) == 1


PP_PLACEMENT_SCRIPT = textwrap.dedent(
    """
    import sys
    from exporters.vllm_metrics import make_sink
    from tests.exporters.test_vllm_stages import pp_placement

    make_sink().publish(pp_placement()[int(sys.argv[1])])
    """
)


def test_the_multiprocess_route_counts_placement_as_the_snapshot_route(tmp_path: Path) -> None:
    """Counters of the stages' processes are summed: a stage after the first adds its moves and nothing else."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for stage_index in ("0", "1"):  # two worker processes
        done = subprocess.run([sys.executable, "-c", PP_PLACEMENT_SCRIPT, stage_index], env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    served = {s.name: s.value for family in registry.collect() for s in family.samples if s.name in PLACEMENT_SERIES}
    assert served == {"moe_placement_swaps_total": 1, "moe_placement_experts_moved_total": 12}
