"""End to end on the embedded engine: skewed routing drives the CV over 0.15, the controller's
rebalancer re-places experts live, the measured CV falls below it, and no request fails."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.actuators.placement import HttpEngineControl, RebalanceEvent, Rebalancer
from controller.policy import ImbalanceObjective, LocalTarget, Objectives, Policy
from controller.rebalance import TriggerSettings
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from harness.loadgen import LoadRequest, run_load
from harness.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def skewed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
                         vocab_size=512, max_position_embeddings=512)
    return init_random_checkpoint(tmp_path_factory.mktemp("skewed"), config, seed=5, router_skew=1.0)


def test_skewed_load_is_rebalanced_live_without_failures(skewed_checkpoint: Path) -> None:
    stack = build_stack(ServeOptions(checkpoint=skewed_checkpoint, ep=2, kv_cache_mb=8, max_num_seqs=16))
    policy = Policy(
        name="demo", target=LocalTarget(model="skewed"),
        objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=2)),
    )
    requests = [LoadRequest(arrival_s=0.05 * i, prompt_tokens=24, max_tokens=24) for i in range(400)]

    async def scenario(url: str) -> tuple[list[RebalanceEvent], list[float], list[bool]]:
        control = HttpEngineControl()
        rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=600, margin=0.02), verify_after_s=3,
                                min_window_steps=8)
        load = asyncio.create_task(run_load(url, requests, vocab_size=512, max_in_flight=16))
        events: list[RebalanceEvent] = []
        cvs: list[float] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(e.kind == "verify" for e in events):
            await asyncio.sleep(0.5)
            snap = await control.expert_load(url)
            if snap.steps_in_window:
                cvs.append(max(snap.imbalance_cv))
            events += await rebalancer.tick(policy, [url], time.monotonic())
        records = await load
        await control.aclose()
        return events, cvs, [r.ok for r in records]

    with ServerThread(stack.app, port=free_port()) as server:
        events, cvs, oks = asyncio.run(scenario(server.url))

    applied = [e for e in events if e.kind == "rebalance"]
    verified = [e for e in events if e.kind == "verify"]
    assert cvs and cvs[0] > 0.15, f"the skewed router should unbalance the contiguous placement: {cvs[:5]}"
    assert len(applied) == 1 and applied[0].outcome == "applied", [e.to_json() for e in events]
    assert applied[0].swap is not None and applied[0].swap["experts_moved"] > 0
    assert applied[0].plan is not None and applied[0].plan["imbalance_after_cv"] < 0.15
    assert len(verified) == 1 and verified[0].verify is not None
    measured = verified[0].verify.measured_cv
    assert measured is not None and measured < 0.15, verified[0].to_json()
    assert verified[0].outcome == "verified"
    assert all(oks), f"{oks.count(False)} of {len(oks)} requests failed"
