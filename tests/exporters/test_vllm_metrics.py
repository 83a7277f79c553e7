"""Publishing the vLLM plugin's snapshots: file hand-over, multiprocess Prometheus, off by default."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

from engine.vllm_plugin import ExpertLoadSnapshot
from exporters import vllm_metrics
from exporters.vllm_metrics import SnapshotCollector, SnapshotFileSink, snapshot_families

ROOT = Path(__file__).resolve().parents[2]


def snapshot(scale: int = 1, engine: str = "0") -> ExpertLoadSnapshot:
    return ExpertLoadSnapshot(
        model_name="m",
        engine=engine,
        layer_ids=(0, 2),
        expert_tokens_total=np.array([[3, 1, 0, 0], [2, 2, 2, 2]], dtype=np.int64) * scale,
        rank_tokens_total=np.array([4.0, 8.0]) * scale,
        window_rank_tokens=np.array([[4.0, 0.0], [4.0, 4.0]]),
        rank_source="virtual",
    )


def test_file_sink_and_collector_serve_the_moe_families(tmp_path: Path) -> None:
    SnapshotFileSink(tmp_path).publish(snapshot())
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(tmp_path))
    value = registry.get_sample_value
    base = {"model_name": "m", "engine": "0"}
    assert value("moe_expert_tokens_total", {**base, "layer": "0", "expert": "0"}) == 3
    assert value("moe_expert_tokens_total", {**base, "layer": "2", "expert": "3"}) == 2
    assert value("moe_rank_tokens_total", {**base, "rank": "1"}) == 8
    assert value("moe_layer_imbalance_cv", {**base, "layer": "0"}) == pytest.approx(1.0)
    assert value("moe_layer_imbalance_cv", {**base, "layer": "2"}) == 0.0
    assert value("moe_layer_balancedness", {**base, "layer": "0"}) == pytest.approx(0.5)
    assert value("moe_imbalance_cv_across_layers", {**base, "stat": "max"}) == pytest.approx(1.0)
    assert value("moe_balancedness_across_layers", {**base, "stat": "min"}) == pytest.approx(0.5)


def test_collector_sums_rank_totals_of_workers_and_skips_stale_files(tmp_path: Path) -> None:
    (tmp_path / "worker-1.json").write_text(snapshot().to_json())
    (tmp_path / "worker-2.json").write_text(snapshot(engine="1").to_json())
    stale = tmp_path / "worker-3.json"
    stale.write_text(snapshot(scale=100).to_json())
    old = time.time() - 120
    os.utime(stale, (old, old))
    (tmp_path / "worker-4.json").write_text("{not json")
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(tmp_path, max_age_s=30))
    assert registry.get_sample_value("moe_rank_tokens_total", {"model_name": "m", "engine": "0", "rank": "0"}) == 4
    assert registry.get_sample_value("moe_rank_tokens_total", {"model_name": "m", "engine": "1", "rank": "0"}) == 4
    assert snapshot_families([]) == []


def test_disabled_plugin_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_VLLM_PLUGIN", raising=False)
    collectors = set(REGISTRY._collector_to_names)
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    vllm_metrics.register()
    assert set(REGISTRY._collector_to_names) == collectors
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks
    assert vllm_metrics.ARMED == {}
    assert "MOESLO_VLLM_METRICS_DIR" not in os.environ


def test_bad_settings_disable_the_plugin_with_a_message(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MOESLO_VLLM_PLUGIN", "1")
    monkeypatch.setenv("MOESLO_VLLM_EP_RANKS", "zero")
    vllm_metrics.register()
    assert vllm_metrics.ARMED == {}
    assert "MOESLO_VLLM_EP_RANKS='zero' is not an integer" in caplog.text


def test_a_flush_interval_out_of_range_disables_the_plugin_with_a_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    monkeypatch.setenv("MOESLO_VLLM_PLUGIN", "1")
    monkeypatch.setenv("MOESLO_VLLM_FLUSH_S", "1e10")  # the flush thread's wait overflowed: no snapshot, ever
    vllm_metrics.register()
    assert vllm_metrics.ARMED == {}
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks
    assert "moeslo vLLM plugin disabled: MOESLO_VLLM_FLUSH_S='1e10' must be between 0.1 and 60 seconds" in caplog.text


@pytest.fixture
def loggers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """The ``moeslo`` and ``vllm`` loggers, given back as they were (caplog needs ours to propagate), in a
    process that has imported vLLM (as a vLLM process has, when it calls the plugin)."""
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    ours, theirs = logging.getLogger("moeslo"), logging.getLogger("vllm")
    saved = [(log, list(log.handlers), log.level, log.propagate) for log in (ours, theirs)]
    yield ours, theirs
    for log, handlers, level, propagate in saved:
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate


def test_the_plugins_info_lines_reach_vllms_handler_at_vllms_level(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    _, theirs = loggers
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))
    theirs.addHandler(handler)
    theirs.setLevel(logging.INFO)
    theirs.propagate = False  # as vLLM's logging config sets it
    vllm_metrics.follow_vllm_logging()
    plugin = logging.getLogger("moeslo.vllm_plugin")
    plugin.info("counting routed tokens")
    plugin.debug("below vLLM's level")
    assert stream.getvalue() == "INFO [moeslo.vllm_plugin] counting routed tokens\n"
    later = io.StringIO()  # vLLM configured again (its spawned processes do): the new handler is used
    theirs.handlers[:] = [logging.StreamHandler(later)]
    theirs.setLevel(logging.DEBUG)
    plugin.debug("now at vLLM's debug level")
    assert later.getvalue() == "now at vLLM's debug level\n"


def test_without_vllms_handlers_the_plugins_lines_reach_the_users_root_handlers(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    """VLLM_CONFIGURE_LOGGING=0 leaves logging to the user: vLLM's lines propagate to the root, so must ours."""
    _, theirs = loggers
    theirs.handlers[:] = []
    theirs.setLevel(logging.INFO)
    theirs.propagate = True
    stream = io.StringIO()
    root_handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(root_handler)
    try:
        vllm_metrics.follow_vllm_logging()
        logging.getLogger("moeslo.vllm_plugin").info("counting routed tokens")
    finally:
        logging.getLogger().removeHandler(root_handler)
    assert stream.getvalue() == "counting routed tokens\n"


def test_a_moeslo_logger_configured_already_is_left_alone(loggers: tuple[logging.Logger, logging.Logger]) -> None:
    ours, theirs = loggers
    own = logging.NullHandler()
    ours.addHandler(own)
    theirs.addHandler(logging.StreamHandler(io.StringIO()))
    vllm_metrics.follow_vllm_logging()
    assert ours.handlers == [own] and ours.propagate


MULTIPROC_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from prometheus_client import CollectorRegistry, multiprocess
    from engine.vllm_plugin import ExpertLoadSnapshot
    from exporters.vllm_metrics import MultiprocessSink, make_sink

    def snap(scale):
        return ExpertLoadSnapshot(model_name="m", engine="0", layer_ids=(0, 1),
            expert_tokens_total=np.array([[3, 1], [0, 4]]) * scale, rank_tokens_total=np.array([4.0, 4.0]) * scale,
            window_rank_tokens=np.array([[3.0, 1.0], [0.0, 4.0]]) * scale, rank_source="virtual")

    sink = make_sink()
    assert isinstance(sink, MultiprocessSink), type(sink)
    sink.publish(snap(1))
    sink.publish(snap(5))
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    out = {}
    for family in registry.collect():
        for s in family.samples:
            out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    print(json.dumps(out))
    """
)


def test_multiprocess_sink_writes_prometheus_multiprocess_files(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", MULTIPROC_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    def get(name: str, **labels: str) -> float:
        return float(out[name + json.dumps({"engine": "0", "model_name": "m", **labels}, sort_keys=True)])

    assert get("moe_expert_tokens_total", layer="0", expert="0") == 15  # cumulative, not 3 + 15
    assert get("moe_expert_tokens_total", layer="1", expert="0") == 0  # every series exists
    assert get("moe_rank_tokens_total", rank="1") == 20
    assert get("moe_layer_imbalance_cv", layer="1") == pytest.approx(1.0)
    assert get("moe_layer_balancedness", layer="0") == pytest.approx(2 / 3)


LATE_MULTIPROC_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from prometheus_client import values  # before the directory is set: vLLM's CLI imports it first
    from engine.vllm_plugin import ExpertLoadSnapshot
    from exporters.vllm_metrics import MultiprocessSink, make_sink

    assert values.ValueClass.__name__ != "MmapedValue"
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]  # as vLLM's setup_multiprocess_prometheus does
    sink = make_sink()
    assert isinstance(sink, MultiprocessSink), type(sink)
    sink.publish(ExpertLoadSnapshot(model_name="m", engine="0", layer_ids=(0, 1),
        expert_tokens_total=np.array([[3, 1], [0, 4]]), rank_tokens_total=np.array([4.0, 4.0]),
        window_rank_tokens=np.array([[3.0, 1.0], [0.0, 4.0]]), rank_source="virtual"))
    """
)


def test_a_directory_set_after_prometheus_client_was_imported_still_gets_the_multiprocess_files(
    tmp_path: Path,
) -> None:
    """``vllm serve --api-server-count 2`` (or ``--data-parallel-size 2``): vLLM loads the plugins while it builds
    its parser, then sets ``PROMETHEUS_MULTIPROC_DIR``, then forks the engine cores, whose prometheus_client
    was imported without it.  The workers must still write the files vLLM's API servers serve."""
    shared, handover = tmp_path / "prometheus", tmp_path / "handover"
    shared.mkdir()
    handover.mkdir()
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(PYTHONPATH=str(ROOT), MOESLO_VLLM_METRICS_DIR=str(handover))  # the parent's register() set it
    proc = subprocess.run([sys.executable, "-c", LATE_MULTIPROC_SCRIPT, str(shared)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(shared.glob("*.db")) and not list(handover.iterdir())
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(shared))
    base = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("moe_expert_tokens_total", {**base, "layer": "1", "expert": "1"}) == 4
    assert registry.get_sample_value("moe_rank_tokens_total", {**base, "rank": "0"}) == 4
    assert registry.get_sample_value("moe_layer_imbalance_cv", {**base, "layer": "1"}) == pytest.approx(1.0)


def big_snapshot(layers: int, experts: int) -> ExpertLoadSnapshot:
    return ExpertLoadSnapshot(
        model_name="m", engine="0", layer_ids=tuple(range(layers)),
        expert_tokens_total=np.ones((layers, experts), dtype=np.int64), rank_tokens_total=np.full(8, experts / 8),
        window_rank_tokens=np.ones((layers, 8)), rank_source="virtual",
    )  # fmt: skip


def test_per_expert_series_stop_at_the_engines_cap_unless_forced() -> None:
    def names(snap: ExpertLoadSnapshot, setting: bool | None) -> dict[str, int]:
        return {f.name: len(f.samples) for f in snapshot_families([snap], setting)}

    deepseek = big_snapshot(58, 256)  # 14,848 series: the scrape built them in vLLM's event loop
    assert "moe_expert_tokens" not in names(deepseek, None)
    assert names(deepseek, None)["moe_layer_imbalance_cv"] == 58  # the rest stays
    assert names(deepseek, True)["moe_expert_tokens"] == 58 * 256
    assert names(big_snapshot(16, 256), None)["moe_expert_tokens"] == 4096  # at the cap: on
    assert "moe_expert_tokens" not in names(big_snapshot(16, 256), False)


def stage_snapshot(first_layer: int, layers: int, experts: int, engine_moe_layers: int) -> ExpertLoadSnapshot:
    """One pipeline stage's snapshot (its layers labelled by the model's layer index)."""
    return ExpertLoadSnapshot(
        model_name="m", engine="0", layer_ids=tuple(range(first_layer, first_layer + layers)),
        expert_tokens_total=np.ones((layers, experts), dtype=np.int64), rank_tokens_total=np.full(8, 1.0),
        window_rank_tokens=np.ones((layers, 8)), rank_source="ep", engine_moe_layers=engine_moe_layers,
    )  # fmt: skip


def test_the_expert_series_cap_counts_the_layers_of_every_pipeline_stage(tmp_path: Path) -> None:
    """DeepSeek-V3 under --pipeline-parallel-size 4: each stage's 13-15 MoE layers x 256 experts sat under the
    4,096 cap, so the engine published all 14,848 series the cap exists to leave out."""
    stages = [stage_snapshot(3, 13, 256, 61), *(stage_snapshot(16 + 15 * i, 15, 256, 61) for i in range(3))]
    for i, stage in enumerate(stages):  # the snapshot route: the workers' files, served by the API server
        (tmp_path / f"worker-{i}.json").write_text(stage.to_json())
    served = [f.name for f in SnapshotCollector(tmp_path).collect()]
    assert "moe_expert_tokens" not in served and "moe_layer_imbalance_cv" in served
    for stage in stages:  # the multiprocess route: each stage's worker decides alone
        registry = CollectorRegistry()
        vllm_metrics.MultiprocessSink(registry).publish(stage)
        labels = {"model_name": "m", "engine": "0", "layer": str(stage.layer_ids[0]), "expert": "0"}
        assert registry.get_sample_value("moe_expert_tokens_total", labels) is None
    small = stage_snapshot(2, 2, 8, 4)  # 4 layers x 8 experts over two stages: under the cap
    assert next(f.name for f in snapshot_families([small])) == "moe_expert_tokens"
    assert ExpertLoadSnapshot.from_json(small.to_json()).engine_moe_layers == 4


@pytest.mark.parametrize(("raw", "expected"), [("", None), ("auto", None), ("1", True), ("0", False), ("OFF", False)])
def test_the_expert_series_setting(raw: str, expected: bool | None) -> None:
    from engine.vllm_plugin.settings import PluginSettings

    assert PluginSettings.from_env({"MOESLO_VLLM_EXPERT_SERIES": raw}).expert_series is expected


def test_a_bad_expert_series_setting_is_named() -> None:
    from contracts.errors import ValidationError
    from engine.vllm_plugin.settings import PluginSettings

    with pytest.raises(ValidationError, match="MOESLO_VLLM_EXPERT_SERIES='maybe' is not auto, 1 or 0"):
        PluginSettings.from_env({"MOESLO_VLLM_EXPERT_SERIES": "maybe"})


TTFT_LOGGER_SCRIPT = textwrap.dedent(
    """
    from types import SimpleNamespace
    from exporters.vllm_ttft import NormalizedTtftStatLogger

    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name=["m"], model="m"))
    stat_logger = NormalizedTtftStatLogger(config, 0)
    print("built", stat_logger.observer is None)
    """
)


@pytest.mark.vllm
def test_a_bad_setting_never_stops_vllm_building_the_ttft_stat_logger() -> None:
    """vLLM builds every installed stat logger without a guard: one that raises stops vLLM from starting."""
    from harness.vllm_server import vllm_python

    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOESLO_VLLM_FLUSH_S": "0", "MOESLO_VLLM_PLUGIN": "1"}
    proc = subprocess.run([str(python), "-c", TTFT_LOGGER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "built True" in proc.stdout  # off, not raising
    assert "MOESLO_VLLM_FLUSH_S='0' must be between 0.1 and 60 seconds" in proc.stderr


IDLE_TTFT_SCRIPT = textwrap.dedent(
    """
    from types import SimpleNamespace
    from prometheus_client import REGISTRY
    from exporters.vllm_ttft import NormalizedTtftStatLogger

    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name=["m"], model="m"))
    for engine in (0, 1):
        NormalizedTtftStatLogger(config, engine)
    labels = {"model_name": "m", "reference_prompt_tokens": "1000", "per_1k_prompt_tokens_s": "0.05"}
    for engine in ("0", "1"):
        print("count", engine, REGISTRY.get_sample_value("moeslo_ttft_normalized_seconds_count",
                                                         {**labels, "engine": engine}))
    """
)


@pytest.mark.vllm
def test_the_ttft_stat_logger_has_its_engines_series_before_a_request_finishes() -> None:
    """vLLM's own TTFT histogram exists from start: the normalized one must too, or an engine that has served
    nothing yet reads as one not scraped (the TTFT-metric-absent ticket)."""
    from harness.vllm_server import vllm_python

    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOESLO_VLLM_PLUGIN": "1"}
    proc = subprocess.run([str(python), "-c", IDLE_TTFT_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "count 0 0.0" in proc.stdout and "count 1 0.0" in proc.stdout, proc.stdout
