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

from engine.vllm_plugin import ExpertLoadSnapshot
from exporters.vllm_metrics import snapshot_families

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
