"""The OpenTelemetry sink's own rules: which finishes count as successful, the resource, bounded shutdown."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from engine.stats import FinishedRequestStats, StepStats
from exporters.otel import OtelStatsSink


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
        attributes = sink.tracer_provider.resource.attributes  # type: ignore[attr-defined]
    finally:
        sink.shutdown()
    assert attributes["service.name"] == expected
