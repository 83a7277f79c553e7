"""Rebalancing real vLLM EPLB, in process: vLLM 0.32's ``EplbState`` with its real rearrangement code on two
gloo ranks (``vllm_eplb_harness.py``), moeslo's policy inside it, the trigger's routes, and the controller's
rebalance loop driving it over HTTP.

vLLM CPU 0.32 cannot run EPLB with two ranks as a server (docs/vllm.md has the errors); the harness runs
everything that can run for real and says which parts stand in.  Skips without ``.venv-vllm``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from controller.actuators import DryRunActuator
from controller.actuators.placement import Rebalancer
from controller.actuators.vllm_control import AutoEngineControl, VllmEngineControl
from controller.core import CoreConfig, DecisionCore
from controller.policy import Policy
from controller.rebalance import TriggerSettings
from controller.service import ControllerService
from controller.store import Store
from controller.telemetry import ControllerMetrics
from controller.types import PolicyObservation
from harness.processes import free_port, stop_process
from harness.vllm_server import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

HARNESS = Path(__file__).with_name("vllm_eplb_harness.py")
ROOT = Path(__file__).resolve().parents[2]
EXPERTS, SLOTS, LAYERS = 16, 18, 2


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    yield from _harness(tmp_path_factory.mktemp("eplb"))


@pytest.fixture(scope="module")
def async_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """vLLM's default async EPLB: ``rearrange()`` hands over, its worker thread moves the weights, and the steps
    after commit the map layer by layer."""
    yield from _harness(tmp_path_factory.mktemp("eplb-async"), "--eplb-async", duration_s=200)


def _harness(out: Path, *extra: str, duration_s: int = 420) -> Iterator[tuple[str, Path]]:
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "HARNESS_PORT": str(free_port()), "HARNESS_HTTP_PORT": str(free_port()),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    log = (out / "harness.log").open("wb")
    command = [str(python), str(HARNESS), "--world", "2", "--out", str(out), "--duration-s", str(duration_s), *extra]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "port").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the harness did not start: {(out / 'harness.log').read_text()[-3000:]}")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{(out / 'port').read_text()}"
        _wait_for_window(url)
        yield url, out
    finally:
        (out / "stop").write_text("stop")
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_process(proc, group=True)
        log.close()


def _wait_for_window(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{url}/moeslo/eplb", timeout=30).json()
            if status.get("steps_in_window", 0) >= 10:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail("the harness's routing window stayed empty")


def _result(out: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while not (out / "result.json").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    result: dict[str, object] = json.loads((out / "result.json").read_text())
    return result


def test_our_policy_is_registered_and_chosen_by_vllm(harness: tuple[str, Path]) -> None:
    url, _ = harness
    status = httpx.get(f"{url}/moeslo/eplb", timeout=30).json()
    assert status["eplb"]["policy"] == "MoesloEplbPolicy"  # EplbState.policy, looked up by add_model
    assert status["placement_source"] == "eplb" and status["num_ranks"] == 2 and status["workers"] == 2
    assert np.asarray(status["phy2log"]).shape == (LAYERS, SLOTS)
    assert status["counting_workers"] == 1 and status["measured"]["cv_max"] > 0.15  # skewed routing


def test_dry_run_returns_a_plan_vllm_accepts_and_moves_nothing(harness: tuple[str, Path]) -> None:
    url, _ = harness
    before = httpx.get(f"{url}/moeslo/eplb", timeout=30).json()["phy2log"]
    reply = httpx.post(f"{url}/moeslo/eplb/rebalance", json={"dry_run": True}, timeout=60).json()
    assert reply["dry_run"] is True and reply["plan_source"] == "MoesloEplbPolicy"
    plan = np.asarray(reply["phy2log"])
    assert plan.shape == (LAYERS, SLOTS) and all(set(row) == set(range(EXPERTS)) for row in plan.tolist())
    assert reply["predicted_before"]["cv_max"] > 0.15 >= reply["predicted_after"]["cv_max"]
    assert reply["predicted_after"]["balancedness_min"] > reply["predicted_before"]["balancedness_min"]
    assert reply["experts_moved"] > 0 and reply["measured_before"]["cv_max"] > 0.15
    assert httpx.get(f"{url}/moeslo/eplb", timeout=30).json()["phy2log"] == before
    bad = httpx.post(f"{url}/moeslo/eplb/rebalance", json={"dry_run": True, "placement": [[0] * SLOTS] * LAYERS},
                     timeout=60)  # fmt: skip
    assert bad.status_code == 400 and "have no replica" in bad.json()["error"]["message"]


def test_vllm_engine_control_reads_the_window(harness: tuple[str, Path]) -> None:
    url, _ = harness
    control = VllmEngineControl(timeout_s=60)

    async def read() -> tuple[object, dict[str, object]]:
        try:
            return await control.expert_load(url), await control.dry_run(url)
        finally:
            await control.aclose()

    snap, plan = asyncio.run(read())
    assert snap.expert_tokens.shape == (LAYERS, EXPERTS) and snap.placement.num_ranks == 2  # type: ignore[attr-defined]
    assert plan["dry_run"] is True


def _service(tmp_path: Path, url: str) -> tuple[ControllerService, Store, AutoEngineControl]:
    class NoSli:
        async def observe(self, policies: list[Policy], now_s: float) -> dict[str, PolicyObservation]:
            return {p.name: PolicyObservation(policy=p.name, observed_at_s=now_s) for p in policies}

        async def aclose(self) -> None:
            return None

    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(Policy.model_validate({
        "name": "vllm-moe", "mode": "enforce", "target": {"kind": "local", "model": "fake-moe", "endpoints": [url]},
        "objectives": {"imbalance": {"max_cv": 0.15, "sustain_s": 2}},
    }))  # fmt: skip
    control = AutoEngineControl(timeout_s=60)
    service = ControllerService(
        store=store, source=NoSli(), actuator=DryRunActuator(),  # type: ignore[arg-type]
        core=DecisionCore(config=CoreConfig(tick_interval_s=1, stale_after_s=60)),
        metrics=ControllerMetrics(CollectorRegistry()), tick_interval_s=1,
        rebalancer=Rebalancer(control, TriggerSettings(cooldown_s=600, margin=0.02), verify_after_s=3,
                              min_window_steps=8),
    )  # fmt: skip
    return service, store, control


def test_the_controller_rebalances_vllm_and_verifies(harness: tuple[str, Path], tmp_path: Path) -> None:
    url, out = harness
    swap, metrics = _rebalance_and_verify(url, out, tmp_path)
    assert swap["applied"] is True and swap["stall_s"] > 0 and swap["pending"] is False
    assert 'moe_placement_swap_duration_seconds_count{engine="0",model_name="fake-moe"} 1.0' in metrics


def test_the_controller_rebalances_async_vllm_once_committed_and_verifies(
    async_harness: tuple[str, Path], tmp_path: Path
) -> None:
    """vLLM 0.32's default async EPLB commits after it answers: the rebalance was logged failed, unverified."""
    url, out = async_harness
    swap, metrics = _rebalance_and_verify(url, out, tmp_path)
    assert swap["applied"] is True and swap["pending"] is True and swap["async"] is True
    assert swap["commit_wait_s"] >= 0
    # The stall is spread over vLLM's steps: no duration is observed for it.
    assert 'moe_placement_swap_duration_seconds_count{engine="0",model_name="fake-moe"} 0.0' in metrics


def _rebalance_and_verify(url: str, out: Path, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The controller's loop until it verifies a rebalance; the swap it logged and vLLM's /metrics then."""
    service, store, control = _service(tmp_path, url)

    async def loop() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            d.action == "verify_rebalance" for d in store.list_decisions(policy="vllm-moe")
        ):
            await service.tick()
            await asyncio.sleep(0.5)
        await control.aclose()

    asyncio.run(loop())
    records = {d.action: d for d in store.list_decisions(policy="vllm-moe") if d.action.endswith("rebalance")}
    assert control.kind(url) == "vllm"
    applied, verified = records["rebalance"], records["verify_rebalance"]
    assert (applied.reason, applied.outcome) == ("rebalance", "applied"), applied.detail
    swap: dict[str, Any] = applied.inputs["swap"]
    assert swap["experts_moved"] > 0
    assert swap["predicted_after_cv_max"] <= 0.15 < swap["predicted_before_cv_max"]
    assert verified.outcome == "verified", verified.detail
    assert verified.inputs["verify"]["measured_cv"] <= 0.15
    assert applied.at <= verified.at <= datetime.now(UTC)
    # The rearrangement is on vLLM's /metrics (moe_placement_*): predicted and measured, before and after.
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'moe_placement_swaps_total{engine="0",model_name="fake-moe"} 1.0' in metrics
    assert 'moe_placement_requests_total{action="apply",engine="0",model_name="fake-moe",outcome="ok"} 1.0' in metrics
    measured_after = [line for line in metrics.splitlines()
                      if line.startswith("moe_placement_imbalance_cv{") and 'source="measured",when="after"' in line]
    assert measured_after and float(measured_after[0].rsplit(" ", 1)[1]) <= 0.15
    # vLLM committed the plan: every rank's weights hold the map's experts, and its own maps agree.
    (out / "stop").write_text("stop")
    ranks = _result(out)["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 2
    for rank in ranks:
        assert rank["weights_match_map"] and rank["l2p_matches_vllm"] and rank["replica_count_matches_vllm"], rank
        assert rank["policy_class"] == "MoesloEplbPolicy"
    assert ranks[0]["phy2log"] == ranks[1]["phy2log"]
    return swap, metrics
