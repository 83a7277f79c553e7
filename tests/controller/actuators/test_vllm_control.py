"""The rebalancer's vLLM adapter over the plugin's real routes (stand-in workers, in-process ASGI), and the
per-endpoint choice between vLLM and the embedded engine."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from contracts.errors import UnavailableError
from contracts.placement import Placement
from controller.actuators.placement import HttpEngineControl, Rebalancer
from controller.actuators.vllm_control import STATUS_PATH, AutoEngineControl, VllmEngineControl, swap_summary
from controller.policy import ImbalanceObjective, LocalTarget, Mode, Objectives, Policy
from controller.rebalance import TriggerSettings
from tests.engine.eplb_standin import EXPERTS, LAYERS, SLOTS, route
from tests.exporters.test_vllm_eplb_http import StandinEngineClient, app_for

VLLM, EMBEDDED = "http://vllm", "http://embedded"


def _embedded(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/expert-load":
        return httpx.Response(200, json={"expert_tokens": [[5, 1]], "imbalance_cv": [0.6], "steps_in_window": 20})
    if request.url.path == "/v1/placement":
        return httpx.Response(200, json={"num_ranks": 2, "phy2log": [[0, 1]]})
    return httpx.Response(404, json={"detail": "Not Found"})


def _client(engine: StandinEngineClient) -> httpx.AsyncClient:
    vllm = httpx.ASGITransport(app=app_for(engine))
    embedded = httpx.MockTransport(_embedded)
    return httpx.AsyncClient(mounts={f"{VLLM}": vllm, f"{EMBEDDED}": embedded})


def test_vllm_control_reads_the_window_and_applies_the_controllers_placement() -> None:
    engine = StandinEngineClient()

    async def run() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        control = VllmEngineControl(_client(engine))
        try:
            snap = await control.expert_load(VLLM)
            plan = await control.dry_run(VLLM)
            mine = Placement(np.tile(np.arange(SLOTS)[::-1] % EXPERTS, (LAYERS, 1)), 2)
            return snap, plan, await control.apply_placement(VLLM, mine)
        finally:
            await control.aclose()

    snap, plan, swap = asyncio.run(run())
    assert snap.expert_tokens.shape == (LAYERS, EXPERTS) and snap.placement.num_ranks == 2
    assert snap.steps_in_window >= 1 and max(snap.imbalance_cv) > 0.15
    assert plan["dry_run"] is True
    assert swap["applied"] is True and "phy2log" not in swap and swap["experts_moved"] > 0
    assert set(swap) >= {"stall_s", "predicted_before_cv_max", "predicted_after_cv_max", "workers"}
    assert engine.states[0].model_state.physical_to_logical_map.tolist() == np.tile(
        np.arange(SLOTS)[::-1] % EXPERTS, (LAYERS, 1)).tolist()


def test_refusals_become_unavailable_errors_naming_the_reason() -> None:
    engine = StandinEngineClient(eplb=False)

    async def run() -> None:
        control = VllmEngineControl(_client(engine))
        try:
            snap = await control.expert_load(VLLM)  # EPLB off: the static layout, so advisory mode works
            assert snap.placement.num_ranks == 2
            with pytest.raises(UnavailableError, match="HTTP 409: eplb_off: EPLB is off"):
                await control.apply_placement(VLLM, snap.placement)
        finally:
            await control.aclose()

    asyncio.run(run())


def test_async_eplb_is_applied_once_vllm_has_committed_the_map() -> None:
    """vLLM 0.32's default async EPLB answers before it commits: every live rebalance was logged failed, though
    vLLM carried it out a few steps later, unverified."""
    engine = StandinEngineClient(async_eplb=True)
    mine = Placement(np.tile(np.arange(SLOTS)[::-1] % EXPERTS, (LAYERS, 1)), 2)

    async def run(control: VllmEngineControl) -> dict[str, Any]:
        try:
            return await control.apply_placement(VLLM, mine)
        finally:
            await control.aclose()

    swap = asyncio.run(run(VllmEngineControl(_client(engine), commit_poll_s=0.01)))
    assert swap["applied"] is True and swap["pending"] is True and swap["async"] is True and swap["commit_wait_s"] >= 0
    assert engine.states[0].model_state.physical_to_logical_map.tolist() == mine.phy2log.tolist()
    idle = StandinEngineClient(async_eplb=True)
    idle.stepping = False  # no step, no commit: bounded, and said so
    with pytest.raises(UnavailableError, match=r"had not committed it after 0\.05 s"):
        asyncio.run(run(VllmEngineControl(_client(idle), commit_timeout_s=0.05, commit_poll_s=0.01)))


@pytest.mark.parametrize("async_eplb", [False, True])
def test_auto_control_picks_the_adapter_per_endpoint_and_rebalances_vllm(async_eplb: bool) -> None:
    engine = StandinEngineClient(async_eplb=async_eplb)
    policy = Policy(name="p", target=LocalTarget(), mode=Mode.ENFORCE,
                    objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=0)))

    async def run() -> tuple[AutoEngineControl, list[Any]]:
        control = AutoEngineControl(_client(engine))
        control.vllm.commit_poll_s = 0.01
        rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=100), verify_after_s=1, min_window_steps=1)
        events = []
        for now in (0.0, 2.0):
            events += await rebalancer.tick(policy, [VLLM], now)
            route(engine.flusher.counter)  # routing on the new placement (the window restarted)
        assert (await control.expert_load(EMBEDDED)).steps_in_window == 20
        await control.aclose()
        return control, events

    control, events = asyncio.run(run())
    assert control.kind(VLLM) == "vllm" and control.kind(EMBEDDED) == "embedded" and control.kind("x") is None
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "applied"), ("verify", "verified")]
    assert events[0].swap["applied"] is True and events[1].verify.measured_cv <= 0.15


def test_auto_control_asks_again_after_a_call_through_the_kind_it_kept_fails() -> None:
    """It asked each endpoint once and kept the answer for good: a first probe answered by a proxy (503 while the
    pod started) or a pod IP taken over by the other kind of engine left that endpoint failing every tick."""
    serving = {"now": "proxy"}
    vllm_status = {"expert_tokens": [[5, 1]], "phy2log": [[0, 1]], "num_ranks": 2, "steps_in_window": 7,
                   "measured": {"cv": [0.6]}}

    def handle(request: httpx.Request) -> httpx.Response:
        if serving["now"] == "proxy":
            return httpx.Response(503, text="upstream not ready")
        if serving["now"] == "embedded":
            return _embedded(request)
        found = request.url.path == STATUS_PATH
        return httpx.Response(200 if found else 404, json=vllm_status if found else {"detail": "Not Found"})

    async def run() -> list[Any]:
        control = AutoEngineControl(httpx.AsyncClient(transport=httpx.MockTransport(handle)))
        seen: list[Any] = []
        for now in ("proxy", "embedded", "embedded", "vllm", "vllm"):
            serving["now"] = now
            try:
                seen.append((await control.expert_load("http://pod")).steps_in_window)
            except UnavailableError:
                seen.append("unavailable")
            seen.append(control.kind("http://pod"))
        await control.aclose()
        return seen

    # The proxy's 503 reads as vLLM; the embedded engine answers at once; the IP's next engine after one failure.
    assert asyncio.run(run()) == [
        "unavailable", None, 20, "embedded", 20, "embedded", "unavailable", None, 7, "vllm",
    ]


def test_auto_control_keeps_the_kind_when_the_engine_refuses_a_request_on_a_route_it_knows() -> None:
    """A 409 (EPLB off) or 422 (a bad placement) is the engine speaking: its kind stands; a 5xx makes it ask again."""
    answers = iter([(200, "the probe"), (409, "eplb_off: EPLB is off"), (422, "placement: bad"), (503, "restarting")])

    def handle(_request: httpx.Request) -> httpx.Response:
        status, detail = next(answers)
        return httpx.Response(status, json={"detail": detail})

    seen: list[str | None] = []

    async def run() -> None:
        control = AutoEngineControl(httpx.AsyncClient(transport=httpx.MockTransport(handle)))
        await control.control_for("http://pod")
        for _ in range(3):
            with pytest.raises(UnavailableError):
                await control.expert_load("http://pod")
            seen.append(control.kind("http://pod"))
        await control.aclose()

    asyncio.run(run())
    assert seen == ["vllm", "vllm", None]


def test_swap_summary_keeps_figures_not_matrices() -> None:
    reply = {"applied": True, "phy2log": [[0]], "experts_moved": 3, "predicted_after": {"cv_max": 0.1,
             "balancedness_min": 0.9, "cv": [0.1]}}  # fmt: skip
    assert swap_summary(reply) == {"applied": True, "experts_moved": 3, "predicted_after_cv_max": 0.1,
                                   "predicted_after_balancedness_min": 0.9}  # fmt: skip


@pytest.mark.parametrize("answer", [
    httpx.Response(200, text="<html>sign in</html>", headers={"content-type": "text/html"}),
    httpx.Response(200, json={"expert_tokens": [[1, 2]], "phy2log": "oops", "num_ranks": 2}),
    httpx.Response(200, json=["not", "an", "object"]),
])
def test_an_engine_answering_the_wrong_thing_is_unavailable_not_a_crash_of_the_tick(answer: httpx.Response) -> None:
    """A JSONDecodeError or KeyError here escaped the rebalancer and aborted the whole tick, after its scale
    actions were applied and before they were logged: the tick skips only what raises our errors."""
    from contracts.errors import MoesloError
    from controller.actuators.placement import HttpEngineControl

    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: answer))
    for control in (VllmEngineControl(client), HttpEngineControl(client)):
        with pytest.raises(MoesloError):
            asyncio.run(control.expert_load("http://e"))


def test_an_engine_that_trickles_its_answer_is_unavailable_within_the_clients_timeout() -> None:
    """A byte every 0.2 s never trips httpx's per-read timeout: the rebalancer's read of that engine (the kind probe,
    then the expert load through the known kind) is bounded as a whole, or it held the tick for every policy."""
    from controller.actuators.placement import HttpEngineControl
    from tests.controller.sources.engine_page import TrickleServer

    slow = TrickleServer()

    async def read(control: AutoEngineControl | HttpEngineControl) -> None:
        try:
            await asyncio.wait_for(control.expert_load(slow.url), 5.0)
        finally:
            await control.aclose()

    try:
        with pytest.raises(UnavailableError, match=rf"^GET {slow.url}{STATUS_PATH}: no complete answer within 0.5 s$"):
            asyncio.run(read(AutoEngineControl(httpx.AsyncClient(timeout=0.5))))
        with pytest.raises(UnavailableError, match=rf"^GET {slow.url}/v1/expert-load: no complete answer within 0.5 s"):
            asyncio.run(read(HttpEngineControl(httpx.AsyncClient(timeout=0.5))))
    finally:
        slow.stop()


def _pipeline_status() -> dict[str, Any]:
    """vLLM with two pipeline stages: the window has both stages' layers, rank 0's placement its stage's."""
    from engine.vllm_plugin.eplb_requests import merge_status

    def stage(layers: list[int]) -> dict[str, Any]:
        tokens = np.tile(np.array([[400, 300, 10, 10, 10, 10, 10, 10]]), (len(layers), 1)).tolist()
        return {"eplb": None, "policy": None, "num_ranks": 2, "placement_source": "ep", "placement_log": None,
                "phy2log": Placement.contiguous(len(layers), 8, 2).phy2log.tolist(),
                "window": {"layer_ids": layers, "expert_tokens": tokens, "expert_tokens_total": tokens,
                           "active_flushes": 50, "rank_source": "ep"}}

    return merge_status([stage([0, 1]), stage([2, 3])])


def _embedded_answer(load: dict[str, Any], placement: Any) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=load if request.url.path == "/v1/expert-load" else placement)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


LOAD_1x2 = {"expert_tokens": [[5, 1]], "imbalance_cv": [0.6], "steps_in_window": 20}


@pytest.mark.parametrize(("control", "message"), ids=["pipeline", "layers", "cv", "experts", "placement"], argvalues=[
    (lambda: VllmEngineControl(httpx.AsyncClient(transport=httpx.MockTransport(
        lambda _: httpx.Response(200, json=_pipeline_status())))),
     r"counts 4 layers of routed tokens but its placement has 2 \(pipeline parallelism"),
    (lambda: HttpEngineControl(_embedded_answer({**LOAD_1x2, "expert_tokens": [[5, 1], [2, 2]],
                                                  "imbalance_cv": [0.6, 0.0]}, {"num_ranks": 2, "phy2log": [[0, 1]]})),
     "counts 2 layers of routed tokens but its placement has 1"),
    (lambda: HttpEngineControl(_embedded_answer({**LOAD_1x2, "imbalance_cv": [0.6, 0.1]},
                                                {"num_ranks": 2, "phy2log": [[0, 1]]})),
     "reports the CV of 2 layers but counts 1"),
    (lambda: HttpEngineControl(_embedded_answer({**LOAD_1x2, "expert_tokens": [[5, 1, 0]]},
                                                {"num_ranks": 2, "phy2log": [[0, 3]]})),
     "its placement names expert 3 but it counts 3 experts"),
    (lambda: HttpEngineControl(_embedded_answer(LOAD_1x2, {"num_ranks": 2, "phy2log": "oops"})),
     "malformed answer"),
])
def test_a_snapshot_whose_parts_disagree_is_the_engines_unavailability_naming_them(control: Any, message: str) -> None:
    """The rows of routed tokens, of the placement and of the CVs must agree: a bare ValueError from the
    rebalancer's arithmetic (vLLM with pipeline parallelism) aborted every engine's rebalancing that tick."""
    with pytest.raises(UnavailableError, match=message):
        asyncio.run(control().expert_load("http://e"))


def test_a_consistent_embedded_snapshot_is_read() -> None:
    snap = asyncio.run(HttpEngineControl(_embedded_answer(LOAD_1x2, {"num_ranks": 2, "phy2log": [[0, 1]]}))
                       .expert_load("http://e"))
    assert snap.expert_tokens.tolist() == [[5, 1]] and snap.imbalance_cv == (0.6,)


def test_an_engine_left_out_for_a_mismatch_is_logged_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    control = VllmEngineControl(httpx.AsyncClient(transport=httpx.MockTransport(
        lambda _: httpx.Response(200, json=_pipeline_status()))))
    rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=100))
    policy = Policy(name="p", target=LocalTarget(), mode=Mode.ENFORCE,
                    objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=10)))

    async def ticks() -> list[Any]:
        return [await rebalancer.tick(policy, ["http://vllm-pp"], now) for now in (0.0, 5.0, 11.0)]

    assert asyncio.run(ticks()) == [[], [], []]
    assert caplog.text.count("pipeline parallelism") == 1


def test_a_commit_not_confirmed_in_time_is_pending_and_verified_once_vllm_commits() -> None:
    """An idle engine commits an async EPLB map only once it steps again: logged failed and forgotten, the plan
    it then carried out was never verified, and the old placement's CVs stayed in the trigger's history."""
    engine = StandinEngineClient(async_eplb=True)
    policy = Policy(name="p", target=LocalTarget(), mode=Mode.ENFORCE,
                    objectives=Objectives(imbalance=ImbalanceObjective(max_cv=0.15, sustain_s=0)))

    async def run() -> list[Any]:
        control = AutoEngineControl(_client(engine))
        control.vllm.commit_poll_s, control.vllm.commit_timeout_s = 0.01, 0.05
        rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=100), verify_after_s=1, min_window_steps=1)
        events = list(await rebalancer.tick(policy, [VLLM], 0.0))  # the window's steps are in: no step to commit
        engine.stepping = True
        for _ in range(LAYERS + 1):  # serving again: each step commits a layer's map (each call is a step here)
            await control.expert_load(VLLM)
        route(engine.flusher.counter)  # routing on the committed map
        events += await rebalancer.tick(policy, [VLLM], 2.0)
        await control.aclose()
        return events

    engine.stepping = False
    events = asyncio.run(run())
    assert [(e.kind, e.outcome) for e in events] == [("rebalance", "applied"), ("verify", "verified")]
    assert events[0].error is not None and "had not committed it after 0.05 s" in events[0].error
