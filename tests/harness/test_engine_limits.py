"""An engine's limits read from its ``/metrics``: vLLM's exposition, the embedded engine's, and neither."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


# vLLM with data parallelism: one /metrics, each info series once per engine (``engine`` label), here with
# engines started with different batch limits (max_num_seqs 64 and 128, chunks 2048 and 1024).
TWO_ENGINES = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="None",num_gpu_blocks="4096"} 1.0
vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="None",num_gpu_blocks="4096"} 1.0
# HELP moeslo_scheduler_config_info The engine's batch limits.
# TYPE moeslo_scheduler_config_info gauge
moeslo_scheduler_config_info{engine="0",max_num_batched_tokens="2048",max_num_seqs="64",model_name="m"} 1.0
moeslo_scheduler_config_info{engine="1",max_num_batched_tokens="1024",max_num_seqs="128",model_name="m"} 1.0
"""


def test_engines_behind_one_metrics_add_up_their_kv_and_batches_but_not_their_chunk() -> None:
    """Two data-parallel engines: the replica holds both KV caches and both batches, and each engine prefills
    its own chunk (the first engine's figures were read as the replica's: half its capacity)."""
    limits = parse_engine_limits(TWO_ENGINES)
    assert (limits.kv_capacity_tokens, limits.max_num_seqs, limits.max_num_batched_tokens) == (
        2 * 16 * 4096, 64 + 128, 1024)
    assert limits == EngineLimits(131_072, 192, 1024, engines=2, uneven=("max_num_seqs", "max_num_batched_tokens"))
    cache_line = VLLM_EXPOSITION.splitlines()[2]
    vllm_dp = VLLM_EXPOSITION.replace(cache_line, cache_line + "\n" + cache_line.replace('engine="0"', 'engine="1"'))
    assert parse_engine_limits(vllm_dp) == EngineLimits(kv_capacity_tokens=2 * 16 * 27306, engines=2)
    # A series written twice for one engine is one engine; an engine that states nothing leaves no whole.
    again = TWO_ENGINES.replace('engine="1",max_num_batched_tokens="1024"', 'engine="0",max_num_batched_tokens="1"')
    assert parse_engine_limits(again).max_num_seqs == 64
    assert parse_engine_limits(again).max_num_batched_tokens == 2048
    partial = TWO_ENGINES.replace('engine="1",kv_cache_size_tokens="None",num_gpu_blocks="4096"',
                                  'engine="1",kv_cache_size_tokens="None",num_gpu_blocks="None"')
    assert parse_engine_limits(partial).kv_capacity_tokens is None


@contextmanager
def _serving(body: str) -> Iterator[str]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def metrics_url() -> Iterator[str]:
    with _serving(VLLM_EXPOSITION) as url:
        yield url


def test_a_profile_takes_each_flag_then_the_engines_figure_then_says_what_it_assumed(metrics_url: str) -> None:
    limits, assumed, engines = profile_limits(metrics_url)
    assert limits == {"kv_capacity_tokens": 16 * 27306, "max_num_seqs": ASSUMED_LIMITS["max_num_seqs"],
                      "prefill_chunk_tokens": ASSUMED_LIMITS["prefill_chunk_tokens"]}
    assert assumed == {"max_num_seqs": 256, "prefill_chunk_tokens": 2048}
    assert engines == ""  # one engine: nothing added up
    limits, assumed, _ = profile_limits(metrics_url, kv_capacity_tokens=5000, max_num_seqs=32,
                                        prefill_chunk_tokens=1024)
    assert (limits, assumed) == ({"kv_capacity_tokens": 5000, "max_num_seqs": 32, "prefill_chunk_tokens": 1024}, {})


def test_a_profile_of_several_engines_says_what_it_added_up() -> None:
    with _serving(TWO_ENGINES) as url:
        limits, assumed, engines = profile_limits(url)
        _, _, given = profile_limits(url, kv_capacity_tokens=5000, max_num_seqs=32)
    assert limits == {"kv_capacity_tokens": 131_072, "max_num_seqs": 192, "prefill_chunk_tokens": 1024}
    assert assumed == {}
    assert engines == ("; kv_capacity_tokens and max_num_seqs summed over 2 engines behind one /metrics; "
                       "prefill_chunk_tokens one engine's (the smallest of 2); "
                       "the engines' max_num_seqs and prefill_chunk_tokens differ")
    assert given == "; prefill_chunk_tokens one engine's (the smallest of 2); the engines' prefill_chunk_tokens differ"


def test_the_profiles_source_names_each_limit_it_assumed() -> None:
    assert assumed_note({}) == ""
    assert assumed_note({"max_num_seqs": 256, "kv_capacity_tokens": 100_000}) == (
        "; assumed max_num_seqs 256; assumed kv_capacity_tokens 100,000")


def test_an_engine_without_metrics_has_no_limits() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when read: nothing listens there
    assert read_engine_limits(f"http://127.0.0.1:{port}", timeout_s=2.0) == EngineLimits()
