"""The OpenTelemetry sink's own rules: which finishes count as successful, the resource, bounded shutdown."""

from __future__ import annotations

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
