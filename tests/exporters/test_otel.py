"""OTLP/HTTP export of GenAI metrics and request spans, received by a real receiver decoding the protobufs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from exporters.otel import FIRST_TOKEN_EVENT
from tests.conftest import free_port
from tests.exporters.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration


def attrs(kvs: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in kvs:  # type: ignore[attr-defined]
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.double_value or list(
            x.string_value for x in v.array_value.values)
    return out


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
                                       json={"prompt": f"otel {i}", "max_tokens": 5, "stream": True}) as resp:
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
