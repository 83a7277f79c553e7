"""OTLP/HTTP export of GenAI metrics and request spans, received by a real receiver decoding the protobufs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.server import ServerThread
from engine.stats import CHAT, ApiRequestStats, EndedChoice, FinishedRequestStats, StepStats
from exporters.app import ServeOptions, build_stack
from exporters.otel import FIRST_TOKEN_EVENT, OtelStatsSink
from harness.processes import free_port
from tests.exporters.otlp_receiver import OtlpReceiver


def attrs(kvs: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in kvs:  # type: ignore[attr-defined]
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.double_value or list(
            x.string_value for x in v.array_value.values)
    return out


@contextmanager
def served_to(receiver: OtlpReceiver, checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    """A client of a server that exports to ``receiver``; its shutdown, on leaving, flushes both OTLP exporters."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only the flush on shutdown exports
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=checkpoint, model_name="tiny-moe", kv_cache_mb=1.0, otlp=True,
                                     port=port))  # fmt: skip
    server = ServerThread(stack.app, port=port).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client
    finally:
        server.stop()


@pytest.mark.integration
def test_otlp_export_reaches_a_real_receiver(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_SERVICE_NAME", "engine-under-test")
        with served_to(receiver, tiny_checkpoint, monkeypatch) as client:
            for i in range(2):
                with client.stream("POST", "/v1/completions",
                                   json={"prompt": f"otel {i}", "max_tokens": 5, "stream": True,
                                         "ignore_eos": True}) as resp:
                    events = [json.loads(line[6:]) for line in resp.iter_lines()
                              if line.startswith("data: ") and line != "data: [DONE]"]
                assert len(events) == 5

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


@pytest.mark.integration
def test_a_chat_is_chat_and_each_api_request_one_span_under_its_response_id(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat was exported as ``text_completion`` under the core's ``cmpl-`` id, and a completion of ``n=2`` as two
    spans, the second under an id its client never saw."""
    with OtlpReceiver() as receiver:
        with served_to(receiver, tiny_checkpoint, monkeypatch) as client:
            chat = client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}).json()
            two = client.post("/v1/completions", json={"prompt": "two", "max_tokens": 4, "n": 2,
                                                       "ignore_eos": True}).json()

        spans = {attrs(span.attributes)["gen_ai.response.id"]: span for span in receiver.spans()}
        assert sorted(spans) == sorted([chat["id"], two["id"]]) and chat["id"].startswith("chatcmpl-")
        chat_attrs, two_attrs = attrs(spans[chat["id"]].attributes), attrs(spans[two["id"]].attributes)
        assert spans[chat["id"]].name == "chat tiny-moe" and chat_attrs["gen_ai.operation.name"] == "chat"
        assert chat_attrs["gen_ai.usage.input_tokens"] == chat["usage"]["prompt_tokens"]
        assert spans[two["id"]].name == "text_completion tiny-moe"
        assert two_attrs["gen_ai.response.finish_reasons"] == ["length", "length"]
        assert (two_attrs["gen_ai.usage.input_tokens"], two_attrs["gen_ai.usage.output_tokens"]) == \
            (two["usage"]["prompt_tokens"], 8)
        assert two_attrs["gen_ai.request.choice.count"] == 2
        # The metrics stay one sample per choice (as vLLM's histograms), each under its operation.
        durations = {attrs(p.attributes)["gen_ai.operation.name"]: p.count
                     for p in receiver.histogram_points("gen_ai.server.request.duration")}
        assert durations == {"chat": 1, "text_completion": 2}


def test_an_api_requests_choices_are_one_span() -> None:
    """Each choice is a request of its own in the core; the span is the API request's: from its arrival to its last
    choice's end, under the id its client read, its first token the first of any choice."""
    sink, spans, _ = _in_memory_sink()
    stats = [FinishedRequestStats(f"cmpl-{i}", reason, 7, generated, e2e, 0.1 + i, 0.1, e2e - 0.2, ttft, None,
                                  CHAT, "chatcmpl-x")
             for i, (reason, generated, e2e, ttft) in enumerate([("length", 4, 1.0, 0.3), ("stop", 2, 0.6, 0.2)])]
    sink.record(StepStats(now_s=5.0, step_duration_s=0.0, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                          prompt_tokens=0, generation_tokens=0, finished=tuple(stats)))
    assert spans.get_finished_spans() == ()  # the choices' spans wait for the request
    sink.record_request(ApiRequestStats("chatcmpl-x", CHAT, 2, (EndedChoice(0, 5.0, stats[0]),
                                                                 EndedChoice(1, 4.6, stats[1]))))
    (span,) = spans.get_finished_spans()
    assert span.name == "chat m"
    assert span.attributes is not None
    assert dict(span.attributes) | {"gen_ai.response.finish_reasons": None} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "moeslo", "gen_ai.system": "moeslo",
        "gen_ai.request.model": "m", "gen_ai.response.model": "m", "gen_ai.response.id": "chatcmpl-x",
        "gen_ai.response.finish_reasons": None, "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 6,
        "gen_ai.request.choice.count": 2, "moeslo.queue_time_s": 0.1}
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length", "stop")
    assert span.end_time - span.start_time == pytest.approx(1.0e9, rel=1e-3)
    (event,) = span.events
    assert event.timestamp - span.start_time == pytest.approx(0.2e9, rel=1e-3)
    assert span.status.status_code.name == "UNSET"


def _in_memory_sink() -> tuple[OtelStatsSink, InMemorySpanExporter, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    sink = OtelStatsSink(meter_provider=MeterProvider(metric_readers=[reader]),
                         tracer_provider=tracer_provider, model_name="m")
    return sink, spans, reader


@pytest.mark.parametrize(("reason", "error_type"), [("abort", "aborted"), ("deadline", "timeout"),
                                                   ("error", "engine_error")])  # fmt: skip
def test_a_deadline_is_the_engines_timeout_not_a_clients_abort(reason: str, error_type: str) -> None:
    """A request the engine ended at its deadline is one of the TTFT SLI's bad events; it read as a client's
    abort, the one unsuccessful finish that is not the engine's failure."""
    sink, spans, reader = _in_memory_sink()
    fin = FinishedRequestStats(request_id="d", finish_reason=reason, prompt_tokens=3, generation_tokens=0,
                               e2e_s=30.0, queue_s=30.0, prefill_s=0.0, decode_s=0.0, ttft_s=None, mean_itl_s=None)
    sink.record(StepStats(now_s=1.0, step_duration_s=0.0, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                          prompt_tokens=0, generation_tokens=0, finished=(fin,)))  # fmt: skip
    data = reader.get_metrics_data()
    (point,) = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                for p in m.data.data_points]  # fmt: skip
    assert point.attributes["error.type"] == error_type
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None and span.attributes["error.type"] == error_type


def test_failed_requests_carry_error_type_and_no_latency_samples() -> None:
    sink, spans, reader = _in_memory_sink()
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
