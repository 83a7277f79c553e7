"""A real Prometheus scrapes the engine's /metrics: the TTFT quantile, and vLLM's per-request token histograms."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from engine.server import ServerThread
from engine.tokenizer import load_tokenizer
from exporters.app import ServeOptions, build_stack
from harness.engine_limits import EngineLimits, read_engine_limits
from harness.monitoring import prometheus_command
from harness.processes import free_port, log_tail, start_process, stop_process

pytestmark = pytest.mark.integration

QUANTILE = 'histogram_quantile(0.99, sum by (le) (vllm:time_to_first_token_seconds_bucket{model_name="tiny-moe"}))'


def query(client: httpx.Client, promql: str) -> list[dict]:
    resp = client.get("/api/v1/query", params={"query": promql})
    resp.raise_for_status()
    return resp.json()["data"]["result"]  # type: ignore[no-any-return]


def test_prometheus_scrapes_engine_and_computes_ttft_quantile(tiny_checkpoint: Path, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name="tiny-moe", kv_cache_mb=1.0))
    server = ServerThread(stack.app, port=port).start()
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: moeslo-engine\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    log_path = tmp_path / "prometheus.log"
    proc = start_process(prometheus_command(binary, tmp_path, port=prom_port, config=config.read_text()),
                         log_path=log_path)
    try:
        limits = read_engine_limits(server.url)  # what `moeslo profile` and `moeslo up` write into a profile
        blocks = stack.engine.blocks
        assert limits == EngineLimits(kv_capacity_tokens=blocks.num_blocks * blocks.block_size, max_num_seqs=128,
                                      max_num_batched_tokens=512)
        with httpx.Client(base_url=server.url, timeout=30) as engine_client:
            for i in range(5):
                resp = engine_client.post("/v1/completions", json={"prompt": f"scrape {i}", "max_tokens": 4})
                assert resp.status_code == 200
        result: list[dict] = []
        with httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=5) as prom:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not result:
                assert proc.poll() is None, log_tail(log_path)
                try:
                    result = query(prom, QUANTILE)
                except httpx.HTTPError:
                    result = []
                if not result:
                    time.sleep(0.5)
            assert result, "Prometheus returned no TTFT quantile"
            p99 = float(result[0]["value"][1])
            assert 0 < p99 <= 2560.0
            up = query(prom, 'up{job="moeslo-engine"}')
            assert up and up[0]["value"][1] == "1"
            count = query(prom, 'vllm:time_to_first_token_seconds_count{model_name="tiny-moe",engine="0"}')
            assert float(count[0]["value"][1]) == 5
            experts = query(prom, 'count(moe_expert_tokens_total{model_name="tiny-moe"})')
            assert float(experts[0]["value"][1]) == 2 * 8
            # vLLM's per-request token histograms, as vLLM's dashboard queries them.
            labels = '{model_name="tiny-moe",engine="0"}'
            generated = query(prom, f"vllm:request_generation_tokens_sum{labels}")
            assert float(generated[0]["value"][1]) == 5 * 4
            longest = query(prom, f"histogram_quantile(0.99, sum by (le) (vllm:request_max_num_generation_tokens_bucket"
                                  f"{labels}))")
            assert 2 < float(longest[0]["value"][1]) <= 5  # all in the (2, 5] bucket
            prompt = query(prom, f"vllm:request_prompt_tokens_sum{labels}")
            tokenizer = load_tokenizer(tiny_checkpoint, 512)
            assert float(prompt[0]["value"][1]) == sum(len(tokenizer.encode(f"scrape {i}")) for i in range(5))
    finally:
        stop_process(proc, 10.0)
        server.stop()
