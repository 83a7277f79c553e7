"""Placement swaps on the EP-2 engine while it serves: nothing fails, nothing is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from harness.loadgen import LoadRequest, run_load
from harness.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_swaps_under_load_lose_and_fail_nothing(tmp_path: Path) -> None:
    config = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                         vocab_size=512, max_position_embeddings=512)
    checkpoint = init_random_checkpoint(tmp_path / "ckpt", config, seed=2, router_skew=1.0)
    stack = build_stack(ServeOptions(checkpoint=checkpoint, ep=2, kv_cache_mb=8, max_num_seqs=16))
    requests = [LoadRequest(arrival_s=0.02 * i, prompt_tokens=20 + i % 7, max_tokens=16) for i in range(120)]
    rng = np.random.default_rng(0)

    async def scenario(url: str) -> tuple[list[object], list[dict[str, object]], httpx.Response, dict[str, object]]:
        load = asyncio.create_task(run_load(url, requests, vocab_size=512, max_in_flight=16))
        swaps = []
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            before = (await client.get("/v1/placement")).json()
            for _ in range(3):
                await asyncio.sleep(0.4)
                phy2log = [rng.permutation(8).tolist() for _ in range(2)]
                response = await client.post("/v1/placement", json={"num_ranks": 2, "phy2log": phy2log})
                assert response.status_code == 200, response.text
                swaps.append(response.json())
            kept = (await client.get("/v1/placement")).json()
            bad = await client.post("/v1/placement", json={"num_ranks": 2, "phy2log": [[0] * 8, [0] * 8]})
            after_bad = (await client.get("/v1/placement")).json()
        assert kept == after_bad and kept != before
        return list(await load), swaps, bad, after_bad

    with ServerThread(stack.app, port=free_port()) as server:
        records, swaps, bad, _ = asyncio.run(scenario(server.url))

    assert bad.status_code in (400, 422) and "no replica" in bad.text
    assert all(s["experts_moved"] >= 0 for s in swaps) and any(s["experts_moved"] > 0 for s in swaps), swaps
    assert len(records) == len(requests)
    failed = [r for r in records if not r.ok]  # type: ignore[attr-defined]
    assert not failed, failed[:3]
    assert all(r.output_tokens == 16 for r in records)  # type: ignore[attr-defined]
