"""Data-parallel engines export apart: each engine's streams under its own service.instance.id, its index on
every data point.  Runs the logger in the vLLM venv, against a real OTLP receiver here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.vllm_server import vllm_python
from tests.exporters.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import types
from exporters.vllm_otel import GenAiOtelStatLogger
config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name=["m"], model="m"))
loggers = [GenAiOtelStatLogger(config, engine_index=i) for i in (0, 1)]
for i, stat_logger in enumerate(loggers):
    stat_logger.sink.record_first_tokens([0.1] * (i + 1))
for stat_logger in loggers:
    stat_logger.shutdown()
"""


API_SERVERS_SCRIPT = """
import types
from exporters.vllm_otel import GenAiOtelStatLogger
model = types.SimpleNamespace(served_model_name=["m"], model="m")
loggers = [GenAiOtelStatLogger(types.SimpleNamespace(model_config=model, parallel_config=types.SimpleNamespace(
    _api_process_count=2, _api_process_rank=rank)), engine_index=0) for rank in (0, 1)]
for i, stat_logger in enumerate(loggers):
    stat_logger.sink.record_first_tokens([0.1] * (i + 1))
for stat_logger in loggers:
    stat_logger.shutdown()
"""


def exported_streams(script: str) -> list[tuple[str, str, str | None, int]]:
    """(service.name, service.instance.id, vllm.engine.index, count) of each TTFT stream ``script`` exports."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    with OtlpReceiver() as receiver:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MOESLO_VLLM_OTEL": "1", "OTEL_METRIC_EXPORT_INTERVAL": "60000",
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_RESOURCE_ATTRIBUTES": "service.name=team-llm,service.instance.id=pod-7"}  # fmt: skip
        env.pop("OTEL_SERVICE_NAME", None)
        done = subprocess.run([str(python), "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        streams = []
        for request in receiver.metrics:
            for rm in request.resource_metrics:
                resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
                for metric in (m for sm in rm.scope_metrics for m in sm.metrics):
                    for point in metric.histogram.data_points:
                        labels = {kv.key: kv.value.string_value for kv in point.attributes}
                        streams.append((resource["service.name"], resource["service.instance.id"],
                                        labels.get("vllm.engine.index"), point.count))  # fmt: skip
    return sorted(streams)


def test_data_parallel_engines_export_streams_that_a_collector_keeps_apart() -> None:
    """Two engines' streams differed only by the resource attribute vllm.engine.index, which the collector's
    Prometheus exporter drops: the same service.instance.id and point attributes, so their cumulative
    histograms collided in one series."""
    streams = exported_streams(SCRIPT)
    assert streams == [("team-llm", "pod-7-engine0", "0", 1), ("team-llm", "pod-7-engine1", "1", 2)]


def test_api_server_processes_export_streams_that_a_collector_keeps_apart() -> None:
    """`--api-server-count 2` (or data parallelism, whose API servers default to one per engine): each API
    server process records the requests it serves for the same engine index, under the pod's
    service.instance.id, so the two processes' cumulative streams collided in one series."""
    streams = exported_streams(API_SERVERS_SCRIPT)
    assert streams == [("team-llm", "pod-7-api0-engine0", "0", 1), ("team-llm", "pod-7-api1-engine0", "0", 2)]
