"""The API process and the engine-core process: failure of either side, disconnects, equal outputs."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.executors import ExecutorOptions, create_executor
from engine.llm_engine import LLMEngine, RequestOutput
from engine.sampling import SamplingParams
from engine.server import ServerThread
from engine.tokenizer import load_tokenizer
from exporters.app import ServeOptions, ServingStack, build_stack
from harness.processes import free_port, stop_process

pytestmark = pytest.mark.integration


def _serve(checkpoint: Path, **overrides: object) -> tuple[ServerThread, ServingStack]:
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=checkpoint, model_name="m", kv_cache_mb=1.0, port=port,
                                     **overrides))  # type: ignore[arg-type]
    return ServerThread(stack.app, port=port).start(), stack


def _wait(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return bool(predicate())  # type: ignore[operator]


def _in_memory_otel() -> tuple[Any, Any]:
    """An OpenTelemetry sink whose spans stay in memory (the sink, the span exporter)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from exporters.otel import OtelStatsSink

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    return OtelStatsSink(meter_provider=MeterProvider(), tracer_provider=tracer_provider, model_name="m"), spans


def _failed_count(exposition: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(exposition)
               for sample in family.samples
               if sample.name == "vllm:request_success_total" and sample.labels["finished_reason"] == "error")


def test_a_killed_engine_core_gives_503_and_a_log_line_not_a_hang(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server, stack = _serve(tiny_checkpoint)
    caplog.set_level(logging.ERROR, logger="moeslo.engine_client")
    otel, spans = _in_memory_otel()
    stack.engine.add_sink(otel)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/health").status_code == 200
            events: list[str] = []

            def stream() -> None:
                payload = {"prompt": "a long one", "max_tokens": 400, "stream": True, "ignore_eos": True}
                with client.stream("POST", "/v1/completions", json=payload) as resp:
                    events.extend(line for line in resp.iter_lines() if line.startswith("data: "))

            reader = threading.Thread(target=stream)
            reader.start()
            assert _wait(lambda: len(events) >= 1, 20)
            pid = stack.engine.pid
            assert pid is not None and pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            reader.join(10)
            assert not reader.is_alive(), "the streaming request hung after the engine core died"
            assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
            health = client.get("/health")
            assert health.status_code == 503
            assert "engine core process exited" in health.json()["status"]
            assert int(health.headers["Retry-After"]) >= 1
            refused = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert refused.status_code == 503
            assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["error"]["code"] == 503
            # The request the core died under is counted as failed, as vLLM counts an errored request.
            assert _failed_count(client.get("/metrics").text) == 1
        # ... and reaches OpenTelemetry as a failed request with its duration and the tokens it had.
        (span,) = spans.get_finished_spans()
        assert span.attributes is not None and span.attributes["error.type"] == "engine_error"
        assert 1 <= int(str(span.attributes["gen_ai.usage.output_tokens"])) < 400
        assert span.attributes["gen_ai.response.finish_reasons"] == ("error",)
        assert any("engine core died" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()


def test_shutdown_stops_the_core_and_reports_its_last_state(tiny_checkpoint: Path) -> None:
    from engine.client import EngineCoreClient
    from engine.engine_types import EngineConfig

    client = EngineCoreClient(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=1.0), EngineConfig()).start()
    try:
        assert client.is_alive
        client.call("check_invariants")
    finally:
        client.shutdown()
    assert not client.is_alive
    assert client.kv_state() == (0, client.num_blocks)


def test_an_api_process_killed_once_serving_leaves_no_socket_folder(tiny_checkpoint: Path) -> None:
    """A stop's last resort (SIGKILL to the replica's group after a bounded wait) used to leave its
    /tmp/moeslo-core-* folder behind: the folder lived until shutdown().  It goes once the core has connected."""
    tmp = Path(tempfile.mkdtemp(prefix="moeslo-t-"))  # short: a socket's path has at most 107 bytes
    code = ("import sys; from pathlib import Path; from engine.client import EngineCoreClient; "
            "from engine.executors import ExecutorOptions; "
            "c = EngineCoreClient(ExecutorOptions(checkpoint=Path(sys.argv[1]), kv_cache_mb=1.0)).start(); "
            "c.call('check_invariants'); print('serving', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny_checkpoint)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"serving\n"  # a call sent and answered: both sockets outlive their paths
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert list(tmp.glob("moeslo-core-*")) == []
    finally:
        stop_process(proc, 10, group=True)
        shutil.rmtree(tmp)


def test_a_non_streaming_client_that_disconnects_is_aborted_and_frees_its_blocks(tiny_checkpoint: Path) -> None:
    server, stack = _serve(tiny_checkpoint)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = b'{"prompt": "walk away", "max_tokens": 400, "ignore_eos": true}'
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert _wait(lambda: stack.engine.kv_state()[0] > 0, 20)
        assert _wait(lambda: stack.engine.kv_state()[0] == 0 and stack.engine.num_requests() == (0, 0), 5)
        stack.engine.blocks.check_invariants()
    finally:
        server.stop()


def test_greedy_outputs_equal_across_the_process_split(tiny_checkpoint: Path) -> None:
    prompts = [[(7 * i + j) % 500 + 1 for j in range(5 + 3 * i)] for i in range(4)]
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=1.0))
    engine = LLMEngine(executor)
    engine.start()
    done = threading.Event()
    outputs: dict[str, list[int]] = {}

    def collect(out: RequestOutput) -> None:
        if out.token_id is not None:
            outputs.setdefault(out.request_id, []).append(out.token_id)
        if out.finished and len(outputs) == len(prompts) and all(len(v) == 9 for v in outputs.values()):
            done.set()

    ids = [engine.add_request(p, SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True), collect)
           for p in prompts]
    assert done.wait(30)
    engine.shutdown()
    # Detokenized as the server does: tokenizer.json when the checkpoint has one, streamed token by token.
    tokenizer = load_tokenizer(tiny_checkpoint, 512)
    in_process = []
    for request_id in ids:
        stream = tokenizer.stream()
        in_process.append("".join(stream.step(t) for t in outputs[request_id]))
    server, _ = _serve(tiny_checkpoint)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            split = []
            for prompt in prompts:
                resp = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 9, "temperature": 0,
                                                            "ignore_eos": True})
                assert resp.json()["usage"]["completion_tokens"] == 9
                split.append(resp.json()["choices"][0]["text"])
    finally:
        server.stop()
    assert split == in_process


def test_routing_statistics_equal_routed_tokens_times_top_k_exactly(tiny_checkpoint: Path) -> None:
    """Every computed token is routed to top-k experts in every MoE layer; the counters lose none."""
    from prometheus_client.parser import text_string_to_metric_families

    server, stack = _serve(tiny_checkpoint)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            lengths = [(5, 7), (23, 3), (40, 11)]
            for index, (prompt_len, max_tokens) in enumerate(lengths):
                # Prompts share no prefix: a prefix-cache hit would route (and count) fewer tokens.
                resp = client.post("/v1/completions", json={"prompt": [3 + index] * prompt_len,
                                                            "max_tokens": max_tokens, "ignore_eos": True})
                assert resp.status_code == 200
            # The last generated token of each request is never fed back: it is not routed.
            computed = sum(p + n - 1 for p, n in lengths)
            per_layer: dict[str, float] = {}
            for family in text_string_to_metric_families(client.get("/metrics").text):
                for sample in family.samples:
                    if sample.name == "moe_expert_tokens_total":
                        per_layer[sample.labels["layer"]] = per_layer.get(sample.labels["layer"], 0) + sample.value
            assert per_layer == {"0": computed * 2, "1": computed * 2}  # top-2
            load = client.get("/v1/expert-load").json()
            assert load["assignments"] == [computed * 2, computed * 2]
            assert [sum(row) for row in load["expert_tokens"]] == load["assignments"]
    finally:
        server.stop()
    assert stack.engine.kv_state()[0] == 0


def test_the_api_process_does_not_import_torch() -> None:
    """The model lives in the engine core; the HTTP side stays light (and cannot run a step by accident)."""
    import subprocess
    import sys

    code = "import sys, exporters.app, engine.server; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
