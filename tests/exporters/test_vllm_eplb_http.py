"""The trigger's routes (``/moeslo/eplb``) and the rebalance metrics, over stand-in workers (no vLLM)."""

from __future__ import annotations

import asyncio
import json
import logging
from argparse import Namespace
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from engine.vllm_plugin import ExpertLoadSnapshot
from engine.vllm_plugin.eplb_control import EplbControl
from engine.vllm_plugin.placement_log import PlacementLog
from exporters.vllm_eplb_http import EplbEndpoint, EplbService
from exporters.vllm_placement import PlacementMetrics, placement_families
from tests.engine.eplb_standin import (
    SLOTS,
    AsyncStandinEplbState,
    StandinEnv,
    StandinEplbState,
    counting_flusher,
    route,
    runner,
)


class StandinEngineClient:
    """``collective_rpc`` over two ranks: rank 0 counts (the first TP rank), rank 1 does not."""

    def __init__(self, *, eplb: bool = True, missing_method: bool = False, worker_fails: bool = False,
                 async_eplb: bool = False) -> None:  # fmt: skip
        """``async_eplb``: vLLM's default async EPLB, which commits a map over the steps after ``rearrange``."""
        kind = AsyncStandinEplbState if async_eplb else StandinEplbState
        self.states = [kind(), kind()] if eplb else [None, None]
        self.stepping = True
        """vLLM steps between two calls (False: an idle engine, which commits nothing)."""
        self.flusher, counter, self.published = counting_flusher(self.states[0])
        route(counter)
        self.controls = [EplbControl(lambda: self.flusher, env=StandinEnv()), EplbControl(env=StandinEnv())]
        self.missing_method = missing_method
        self.worker_fails = worker_fails
        self.calls: list[dict[str, Any]] = []
        self.rpcs = 0
        """Calls that reached the workers (a call to a method they lack included)."""

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = (),
                             kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
        self.rpcs += 1
        # vLLM 0.32's engine core reports every worker failure as a plain Exception (v1/engine/core.py).
        if self.missing_method:
            raise Exception(f"Call to {method} method failed: 'WorkerWrapperBase' object has no attribute '{method}'")
        if self.worker_fails:
            raise Exception(f"Call to {method} method failed: RuntimeError: a worker died")
        self.calls.append(json.loads(args[0]))
        for state in self.states:
            if state is not None and self.stepping:
                state.step()
        return [c.handle(runner(s), args[0]) for c, s in zip(self.controls, self.states, strict=True)]


def app_for(client: StandinEngineClient) -> FastAPI:
    app = FastAPI()
    EplbEndpoint().attach_router(app)
    app.state.moeslo_eplb = EplbService(client)
    return app


def test_status_dry_run_and_rebalance_over_http() -> None:
    engine = StandinEngineClient()
    http = TestClient(app_for(engine))
    status = http.get("/moeslo/eplb").json()
    assert status["workers"] == 2 and status["counting_workers"] == 1 and status["measured"]["cv_max"] > 0.15
    dry = http.post("/moeslo/eplb/rebalance", json={"dry_run": True}).json()
    assert dry["dry_run"] and dry["predicted_after"]["cv_max"] < dry["predicted_before"]["cv_max"]
    assert engine.states[0].rearranged_with == []
    assert engine.calls[-1]["load"] == status["expert_tokens"]  # the summed window goes to every worker
    applied = http.post("/moeslo/eplb/rebalance").json()
    assert applied["applied"] and len(applied["stall_s_per_rank"]) == 2
    maps = [state.model_state.physical_to_logical_map.tolist() for state in engine.states]
    assert applied["phy2log"] == maps[0] == maps[1]
    assert applied["measured_status"]["counting_workers"] == 1


def test_errors_are_json_with_status_codes() -> None:
    http = TestClient(app_for(StandinEngineClient(eplb=False)))
    refused = http.post("/moeslo/eplb/rebalance", json={})
    assert refused.status_code == 409
    assert refused.json()["error"] | {"message": ""} == {"type": "EplbRefusedError", "message": "", "code": 409,
                                                          "reason": "eplb_off"}  # fmt: skip
    assert http.post("/moeslo/eplb/rebalance", json={"dry_run": True}).status_code == 200
    bad = http.post("/moeslo/eplb/rebalance", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "ValidationError"
    wrong = http.post("/moeslo/eplb/rebalance", json={"dry_run": True, "placement": [[0] * SLOTS] * 2})
    assert wrong.status_code == 400 and "vLLM runs 2 x 8" in wrong.text  # EPLB off: the 8-slot layout
    missing = TestClient(app_for(StandinEngineClient(missing_method=True))).get("/moeslo/eplb")
    assert missing.status_code == 409 and "MOESLO_VLLM_PLUGIN=1" in missing.json()["error"]["message"]
    failed = TestClient(app_for(StandinEngineClient(worker_fails=True))).post("/moeslo/eplb/rebalance", json={})
    assert failed.status_code == 503 and "a worker died" in failed.json()["error"]["message"]


def started_app(client: StandinEngineClient) -> FastAPI:
    """The routes as vLLM's API server sets them up (``init_state`` reads the plugin's settings)."""
    app = FastAPI()
    endpoint = EplbEndpoint()
    endpoint.attach_router(app)
    asyncio.run(endpoint.init_state(client, app.state, Namespace()))
    return app


def test_a_bad_setting_is_named_by_the_routes_and_no_worker_is_called(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The bad setting left the workers without the method: every call was a 409 telling to set
    MOESLO_VLLM_PLUGIN=1 (it was set), and vLLM logged the failed call's traceback each time."""
    monkeypatch.setenv("MOESLO_VLLM_PLUGIN", "1")
    monkeypatch.setenv("MOESLO_VLLM_FLUSH_S", "0.001")
    engine = StandinEngineClient(missing_method=True)  # as the workers of a plugin a bad setting switched off
    http = TestClient(started_app(engine))
    caplog.set_level(logging.DEBUG)
    for answer in (http.get("/moeslo/eplb"), http.post("/moeslo/eplb/rebalance", json={"dry_run": True})):
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["type"] == "PluginOffError" and error["reason"] == "bad_setting" and error["code"] == 503
        assert error["problems"] == ["MOESLO_VLLM_FLUSH_S='0.001' must be between 0.1 and 60 seconds"]
        assert error["message"].startswith("the moeslo vLLM plugin is off because of a bad setting: "
                                           "MOESLO_VLLM_FLUSH_S='0.001'")  # fmt: skip
    assert engine.rpcs == 0
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_the_routes_of_a_plugin_switched_off_say_so_without_calling_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MOESLO_VLLM_PLUGIN", raising=False)
    engine = StandinEngineClient(missing_method=True)
    answer = TestClient(started_app(engine)).get("/moeslo/eplb")
    assert answer.status_code == 409
    assert answer.json()["error"] | {"message": ""} == {"type": "EplbRefusedError", "message": "", "code": 409,
                                                         "reason": "plugin_off"}  # fmt: skip
    assert "MOESLO_VLLM_PLUGIN=1" in answer.json()["error"]["message"] and engine.rpcs == 0
    monkeypatch.setenv("MOESLO_VLLM_PLUGIN", "1")  # on: the workers answer
    assert TestClient(started_app(StandinEngineClient())).get("/moeslo/eplb").status_code == 200


def test_placement_metrics_from_snapshots() -> None:
    engine = StandinEngineClient()
    http = TestClient(app_for(engine))
    http.post("/moeslo/eplb/rebalance")
    route(engine.flusher.counter)
    snapshot = engine.flusher.flush()
    families = {f.name: f for f in placement_families([snapshot])}
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    base = (("engine", "0"), ("model_name", "m"))
    assert values[("moe_placement_swaps_total", base)] == 1
    assert values[("moe_placement_experts_moved_total", base)] > 0
    assert values[("moe_placement_swap_duration_seconds_count", base)] == 1
    assert values[("moe_placement_requests_total", (("action", "apply"), *base, ("outcome", "ok")))] == 1
    cv = {(dict(labels)["when"], dict(labels)["source"]): v
          for (name, labels), v in values.items() if name == "moe_placement_imbalance_cv"}
    assert set(cv) == {("before", "predicted"), ("after", "predicted"), ("before", "measured"), ("after", "measured")}
    assert cv[("before", "predicted")] > 0.15 >= cv[("after", "predicted")]
    assert placement_families([]) == []
    # The multiprocess route adds what changed since the last snapshot.
    registry = CollectorRegistry()
    metrics = PlacementMetrics(registry)
    metrics.publish(snapshot)
    metrics.publish(snapshot)
    labels = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("moe_placement_swaps_total", labels) == 1
    assert registry.get_sample_value("moe_placement_swap_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("moe_placement_imbalance_cv",
                                     {**labels, "when": "after", "source": "measured"}) == cv[("after", "measured")]
    assert np.isfinite(cv[("after", "measured")])


def test_a_rearrangement_without_a_measured_stall_adds_no_duration() -> None:
    """vLLM's own rearrangements (and async EPLB's, spread over steps) have no stall: the multiprocess route observed
    the previous one's duration again for each of them."""
    log = PlacementLog()
    registry = CollectorRegistry()
    metrics = PlacementMetrics(registry)

    def publish() -> None:
        metrics.publish(ExpertLoadSnapshot(model_name="m", engine="0", layer_ids=(0,), expert_tokens_total=np.zeros(
            (1, 2), dtype=np.int64), rank_tokens_total=np.zeros(2), window_rank_tokens=np.zeros((1, 2)),
            rank_source="eplb", placement=log.to_json()))  # fmt: skip

    log.rearranged(duration_s=0.5, experts_moved=2, balance={})
    publish()
    log.rearranged(duration_s=None, experts_moved=3, balance={})
    publish()
    labels = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("moe_placement_swaps_total", labels) == 2
    assert registry.get_sample_value("moe_placement_experts_moved_total", labels) == 5
    assert registry.get_sample_value("moe_placement_swap_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("moe_placement_swap_duration_seconds_sum", labels) == 0.5


@pytest.mark.parametrize("body", [
    b'{"placement": [[0, 18446744073709551616]]}',  # past int64: OverflowError, a 500
    b'{"load": [[1, ' + b"9" * 400 + b']]}',  # past float64
    b'{"dry_run": true, "load": [[1, 2]]}\xff',  # not UTF-8: UnicodeDecodeError, a 500
    b"\xff\xfe{",
    b"[" * 100_000,  # nested past the parser's depth
])  # fmt: skip
def test_a_malformed_body_is_a_400_naming_the_problem(body: bytes) -> None:
    http = TestClient(app_for(StandinEngineClient()), raise_server_exceptions=False)
    reply = http.post("/moeslo/eplb/rebalance", content=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "ValidationError"
