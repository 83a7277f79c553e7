"""An engine's limits read from its ``/metrics``: vLLM's exposition, the embedded engine's, and neither."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusStatsSink
from harness.engine_limits import (
    ASSUMED_LIMITS,
    EngineLimits,
    assumed_note,
    parse_engine_limits,
    profile_limits,
    read_engine_limits,
)

VLLM_EXPOSITION = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",\
kv_cache_size_tokens="None",num_cpu_blocks="None",num_gpu_blocks="27306",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_vllms_cache_config_gives_the_kv_capacity_and_no_batch_limits() -> None:
    assert parse_engine_limits(VLLM_EXPOSITION) == EngineLimits(kv_capacity_tokens=16 * 27306)
    stated = VLLM_EXPOSITION.replace('kv_cache_size_tokens="None"', 'kv_cache_size_tokens="430000"')
    assert parse_engine_limits(stated).kv_capacity_tokens == 430_000  # vLLM's own figure comes first


def test_the_embedded_engines_limits_round_trip_through_its_exposition() -> None:
    sink = PrometheusStatsSink(CollectorRegistry(), model_name="m")
    assert parse_engine_limits(sink.render().decode()) == EngineLimits()
    sink.record_engine_limits(block_size=16, num_blocks=1000, max_num_seqs=128, max_num_batched_tokens=512)
    assert parse_engine_limits(sink.render().decode()) == EngineLimits(16_000, 128, 512)


def test_unset_or_nonsense_values_are_not_limits() -> None:
    unset = VLLM_EXPOSITION.replace('num_gpu_blocks="27306"', 'num_gpu_blocks="None"')
    assert parse_engine_limits(unset) == EngineLimits()
    assert parse_engine_limits(VLLM_EXPOSITION.replace('"27306"', '"-5"')) == EngineLimits()


class _Metrics(BaseHTTPRequestHandler):
    body = VLLM_EXPOSITION.encode()

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_profile_takes_each_flag_then_the_engines_figure_then_says_what_it_assumed(metrics_url: str) -> None:
    limits, assumed = profile_limits(metrics_url)
    assert limits == {"kv_capacity_tokens": 16 * 27306, "max_num_seqs": ASSUMED_LIMITS["max_num_seqs"],
                      "prefill_chunk_tokens": ASSUMED_LIMITS["prefill_chunk_tokens"]}
    assert assumed == {"max_num_seqs": 256, "prefill_chunk_tokens": 2048}
    limits, assumed = profile_limits(metrics_url, kv_capacity_tokens=5000, max_num_seqs=32, prefill_chunk_tokens=1024)
    assert (limits, assumed) == ({"kv_capacity_tokens": 5000, "max_num_seqs": 32, "prefill_chunk_tokens": 1024}, {})


def test_the_profiles_source_names_each_limit_it_assumed() -> None:
    assert assumed_note({}) == ""
    assert assumed_note({"max_num_seqs": 256, "kv_capacity_tokens": 100_000}) == (
        "; assumed max_num_seqs 256; assumed kv_capacity_tokens 100,000")


def test_an_engine_without_metrics_has_no_limits() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when read: nothing listens there
    assert read_engine_limits(f"http://127.0.0.1:{port}", timeout_s=2.0) == EngineLimits()
