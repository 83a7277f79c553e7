"""The OpenTelemetry sink's own rules: which finishes count as successful, the resource, bounded shutdown."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from engine.stats import FinishedRequestStats, StepStats
from exporters.otel import OtelStatsSink
from tests.exporters.otlp_receiver import OtlpReceiver, silent_collector

ROOT = Path(__file__).resolve().parents[2]
A_FEW_S = 5.0


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[int, dict[str, object]]]]:
    """Per instrument: each data point's count and attributes."""
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: [(p.count, dict(p.attributes or {})) for p in m.data.data_points]  # type: ignore[union-attr]
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}  # fmt: skip


def test_a_response_vllm_ended_on_repetition_is_a_successful_finish() -> None:
    """vLLM 0.32's ``repetition`` (a repetitive token pattern; the response is complete) was exported as
    ``error.type="aborted"``, with no time-per-token sample."""
    reader = InMemoryMetricReader()
    sink = OtelStatsSink(meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=NoOpTracerProvider(),
                         model_name="m", provider_name="vllm")  # fmt: skip
    finished = tuple(FinishedRequestStats(f"r-{reason}", reason, 10, 50, 2.0, 0.1, 0.2, 1.0, None, 0.02)
                     for reason in ("stop", "repetition"))  # fmt: skip
    sink.record(StepStats(now_s=0.0, step_duration_s=0.0, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                          prompt_tokens=0, generation_tokens=0, finished=finished))  # fmt: skip
    points = _points(reader)
    assert [(count, "error.type" in attrs) for count, attrs in points["gen_ai.server.request.duration"]] == [(2, False)]
    assert [count for count, _ in points["gen_ai.server.time_per_output_token"]] == [2]


@pytest.mark.parametrize(("env", "expected"), [
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=team-llm,deployment.environment=prod"}, "team-llm"),
    ({"OTEL_SERVICE_NAME": "from-name", "OTEL_RESOURCE_ATTRIBUTES": "service.name=team-llm"}, "from-name"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"}, "moeslo-engine"),
])  # fmt: skip
def test_the_service_name_the_environment_gives_is_kept(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    """``OTEL_RESOURCE_ATTRIBUTES=service.name=...``, the spec's other way to name a service, was overridden by
    the default name (only ``OTEL_SERVICE_NAME`` was looked at)."""
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing is recorded, nothing sent
    sink = OtelStatsSink.from_environment(model_name="m")
    try:
        assert sink.tracer_provider is not None
        attributes = sink.tracer_provider.resource.attributes  # type: ignore[attr-defined]
    finally:
        sink.shutdown()
    assert attributes["service.name"] == expected


EMBEDDED_SCRIPT = """
import atexit, time
exit_started = []
atexit.register(lambda: print(f"exit_s {time.monotonic() - exit_started[0]:.2f}", flush=True))  # runs last
from engine.stats import FinishedRequestStats, StepStats
from exporters.otel import OtelStatsSink
finished = (FinishedRequestStats("r1", "stop", 10, 5, 1.0, 0.1, 0.2, 0.7, 0.3, 0.1),)
step = StepStats(now_s=time.monotonic(), step_duration_s=0.01, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                 prompt_tokens=0, generation_tokens=0, finished=finished)
told, left = OtelStatsSink.from_environment(model_name="m"), OtelStatsSink.from_environment(model_name="m")
for sink in (told, left):
    sink.record(step)
started = time.monotonic()
told.shutdown()  # what moeslo serve's shutdown hook calls
print(f"shutdown_s {time.monotonic() - started:.2f}", flush=True)
exit_started.append(time.monotonic())  # the other sink's exporters stop at exit
"""


def test_a_silent_collector_holds_the_engines_shutdown_and_exit_at_most_a_few_seconds() -> None:
    """``moeslo serve --otlp``: the shutdown hook took 15 s on a collector that accepts and never answers,
    and the SDK's exit hooks wait up to 30 s."""
    with silent_collector() as endpoint:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        done = subprocess.run([sys.executable, "-c", EMBEDDED_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    times = {name: float(value) for name, value in re.findall(r"^(shutdown_s|exit_s) ([\d.]+)$", done.stdout, re.M)}
    assert set(times) == {"shutdown_s", "exit_s"}, done.stdout
    assert times["shutdown_s"] <= A_FEW_S and times["exit_s"] <= A_FEW_S, times
    assert done.stderr.count("did not take the last metrics and spans within 3 s") == 2, done.stderr[-2000:]


def _served_one(monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver, **env: str) -> None:
    """A sink from the environment (``env`` on top) records one request and stops: its exports reach ``receiver``."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only the flush on shutdown exports
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sink = OtelStatsSink.from_environment(model_name="m")
    sink.record(StepStats(now_s=0.0, step_duration_s=0.0, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                          prompt_tokens=0, generation_tokens=0,
                          finished=(FinishedRequestStats("r", "stop", 10, 5, 1.0, 0.1, 0.2, 0.7, 0.3, 0.1),)))
    sink.shutdown()


@pytest.mark.parametrize(("env", "metrics", "spans"), [
    ({}, 1, 1),
    ({"OTEL_TRACES_EXPORTER": "none"}, 1, 0),
    ({"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "otlp"}, 0, 1),
    ({"OTEL_METRICS_EXPORTER": "None ", "OTEL_TRACES_EXPORTER": "none"}, 0, 0),
])  # fmt: skip
def test_the_standard_switches_turn_either_export_off(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], metrics: int, spans: int
) -> None:
    """``OTEL_TRACES_EXPORTER=none`` (a metrics-only collector) was ignored: spans went out, and were refused."""
    with OtlpReceiver() as receiver:
        _served_one(monkeypatch, receiver, **env)
    assert (len(receiver.histogram_points("gen_ai.server.request.duration")), len(receiver.spans())) == (metrics,
                                                                                                          spans)


def test_another_exporter_than_otlp_is_said_to_be_unsupported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with OtlpReceiver() as receiver, caplog.at_level(logging.WARNING, "moeslo.otel"):
        _served_one(monkeypatch, receiver, OTEL_TRACES_EXPORTER="console")
    assert [r.getMessage() for r in caplog.records] == [
        "moeslo OTel: OTEL_TRACES_EXPORTER=console: only OTLP/HTTP is supported; the spans go over OTLP/HTTP"]
    assert len(receiver.spans()) == 1
