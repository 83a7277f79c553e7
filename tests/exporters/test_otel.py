"""OTLP/HTTP export of GenAI metrics and request spans, received by a real receiver decoding the protobufs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from exporters.otel import FIRST_TOKEN_EVENT
from harness.processes import free_port
from tests.exporters.otlp_receiver import OtlpReceiver


def attrs(kvs: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in kvs:  # type: ignore[attr-defined]
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.double_value or list(
            x.string_value for x in v.array_value.values)
    return out


@pytest.mark.integration
def test_otlp_export_reaches_a_real_receiver(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "engine-under-test")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only the flush on shutdown exports
        port = free_port()
        stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name="tiny-moe", kv_cache_mb=1.0,
                                         otlp=True, port=port))
        server = ServerThread(stack.app, port=port).start()
        try:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                for i in range(2):
                    with client.stream("POST", "/v1/completions",
                                       json={"prompt": f"otel {i}", "max_tokens": 5, "stream": True,
                                             "ignore_eos": True}) as resp:
                        events = [json.loads(line[6:]) for line in resp.iter_lines()
                                  if line.startswith("data: ") and line != "data: [DONE]"]
                    assert len(events) == 5
        finally:
            server.stop()  # the app's shutdown flushes both OTLP exporters

        for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
                     "gen_ai.server.request.duration"):
            points = receiver.histogram_points(name)
            assert sum(p.count for p in points) == 2, name
            point_attrs = attrs(points[0].attributes)
            assert point_attrs["gen_ai.operation.name"] == "text_completion"
            assert point_attrs["gen_ai.request.model"] == "tiny-moe"
            assert point_attrs["gen_ai.response.model"] == "tiny-moe"
            assert point_attrs["gen_ai.provider.name"] == "moeslo"
            assert all(p.sum > 0 for p in points)
        ttft = receiver.histogram_points("gen_ai.server.time_to_first_token")[0]
        assert 0.5 in list(ttft.explicit_bounds)

        spans = receiver.spans()
        assert len(spans) == 2
        for span in spans:
            assert span.name == "text_completion tiny-moe"
            span_attrs = attrs(span.attributes)
            assert span_attrs["gen_ai.usage.output_tokens"] == 5
            assert span_attrs["gen_ai.response.finish_reasons"] == ["length"]
            (event,) = [e for e in span.events if e.name == FIRST_TOKEN_EVENT]
            assert span.start_time_unix_nano < event.time_unix_nano <= span.end_time_unix_nano
        assert receiver.resource_attributes()["service.name"] == "engine-under-test"


def test_failed_requests_carry_error_type_and_no_latency_samples() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from engine.stats import FinishedRequestStats, StepStats
    from exporters.otel import OtelStatsSink

    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    sink = OtelStatsSink(meter_provider=MeterProvider(metric_readers=[reader]),
                         tracer_provider=tracer_provider, model_name="m")
    aborted = FinishedRequestStats(request_id="a", finish_reason="abort", prompt_tokens=3, generation_tokens=1,
                                   e2e_s=0.5, queue_s=0.1, prefill_s=0.1, decode_s=0.3, ttft_s=0.2,
                                   mean_itl_s=None)
    sink.record(StepStats(now_s=1.0, step_duration_s=0.0, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                          prompt_tokens=0, generation_tokens=0, finished=(aborted,)))
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert set(metrics) == {"gen_ai.server.request.duration"}  # no TTFT / TPOT for a failed request
    (point,) = metrics["gen_ai.server.request.duration"].data.data_points
    assert point.attributes["error.type"] == "aborted" and point.count == 1
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert [e.name for e in span.events] == ["gen_ai.first_token"]
    assert span.end_time - span.start_time == pytest.approx(0.5e9, rel=1e-3)
