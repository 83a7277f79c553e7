"""The trigger's pure parts and its worker side against a stand-in ``EplbState`` (no vLLM needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from contracts.errors import UnavailableError, ValidationError
from engine.vllm_plugin import ExpertLoadSnapshot
from engine.vllm_plugin.eplb_control import EplbControl, integer_load, one_shot_policy
from engine.vllm_plugin.eplb_requests import (
    EplbRefusedError,
    RebalanceRequest,
    merge_replies,
    merge_status,
    plan_figures,
    rank_moves,
)
from tests.engine.eplb_standin import (
    EXPERTS,
    LAYERS,
    SLOTS,
    AsyncStandinEplbState,
    PlannerPolicy,
    StandinEnv,
    StandinEplbState,
    counting_flusher,
    route,
    runner,
)


def test_request_parsing_gathers_every_problem() -> None:
    assert RebalanceRequest.from_json(None).dry_run is False
    req = RebalanceRequest.from_json({"dry_run": True, "placement": {"num_ranks": 2, "phy2log": [[0, 1], [1, 0]]}})
    assert req.placement is not None and req.placement.shape == (2, 2)
    assert req.worker_payload(np.ones((1, 2)))["action"] == "plan"
    with pytest.raises(ValidationError) as err:
        RebalanceRequest.from_json({"dry_run": 1, "when": "soon", "load": [[-1]], "extra": 0})
    assert len(err.value.problems) == 4
    with pytest.raises(ValidationError, match="lets vLLM's policy plan"):
        RebalanceRequest.from_json({"when": "next_window", "placement": [[0]]})
    with pytest.raises(ValidationError, match="JSON object"):
        RebalanceRequest.from_json([1])


def test_a_placement_object_is_read_whole() -> None:
    with pytest.raises(ValidationError, match="needs phy2log"):  # else vLLM's policy planned in its place
        RebalanceRequest.from_json({"placement": {"num_ranks": 8}})
    with pytest.raises(ValidationError, match="num_ranks must be a whole number"):
        RebalanceRequest.from_json({"placement": {"num_ranks": "8", "phy2log": [[0]]}})
    assert RebalanceRequest.from_json({"placement": {"num_ranks": 2, "phy2log": [[0, 1]]}}).placement_ranks == 2


def test_shares_become_counts_with_their_shape() -> None:
    assert integer_load(np.array([[3.0, 1.0]])).tolist() == [[3, 1]]  # counts as they are
    shares = integer_load(np.array([[0.2, 0.2, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05], [0.0] * 8]))
    assert shares[0].tolist() == [200_000] * 4 + [50_000] * 4 and shares[1].tolist() == [0] * 8


def test_moves_count_replicas_new_to_a_rank() -> None:
    before = np.array([[0, 1, 2, 3]])
    after = np.array([[1, 0, 3, 2]])  # slots swapped within ranks: nothing copied between ranks
    assert rank_moves(before, after, 2).tolist() == [0]
    assert rank_moves(before, np.array([[2, 1, 0, 3]]), 2).tolist() == [2]
    figures = plan_figures(np.array([[10.0, 10.0, 1.0, 1.0]]), before, np.array([[0, 2, 1, 3]]), 2)
    assert figures["predicted_before"]["cv_max"] > 0.5 and figures["predicted_after"]["cv_max"] == 0.0
    assert figures["experts_moved"] == 2 and figures["slots_changed"] == 2


def test_replies_merge_and_worker_errors_come_back_typed() -> None:
    window = {"layer_ids": [0], "expert_tokens": [[3, 1]], "active_flushes": 4, "rank_source": "eplb"}
    status = merge_status([
        {"eplb": {"step": 1}, "policy": "P", "num_ranks": 2, "phy2log": [[0, 1]], "window": window},
        {"eplb": {"step": 1}, "policy": "P", "num_ranks": 2, "phy2log": None,
         "window": {**window, "active_flushes": 6}},
    ])  # fmt: skip
    assert status["expert_tokens"] == [[6, 2]] and status["steps_in_window"] == 6 and status["counting_workers"] == 2
    assert status["measured"]["cv_max"] == pytest.approx(0.5)
    assert status["expert_tokens_total"] is None  # a worker that reports no totals: none merged
    counted = {**window, "expert_tokens_total": [[30, 10]]}
    assert merge_status([{"window": counted}, {"window": counted}])["expert_tokens_total"] == [[60, 20]]
    # Pipeline stages count their own layers: side by side, not summed into the first stage's.
    stage = {"active_flushes": 1, "rank_source": "virtual"}
    staged = merge_status([{"window": {**stage, "layer_ids": [0, 1], "expert_tokens": [[4, 0], [4, 0]]}},
                           {"window": {**stage, "layer_ids": [2, 3], "expert_tokens": [[0, 4], [0, 4]]}}])
    assert staged["layer_ids"] == [0, 1, 2, 3] and staged["expert_tokens"] == [[4, 0], [4, 0], [0, 4], [0, 4]]
    merged = merge_replies([{"stall_s": 0.1, "applied": True}, {"stall_s": 0.3}])
    assert merged["stall_s"] == 0.3 and merged["applied"] is True and merged["workers"] == 2
    with pytest.raises(EplbRefusedError) as refused:
        merge_replies([{"error": {"type": "EplbRefusedError", "reason": "eplb_off", "message": "off"}}])
    assert refused.value.reason == "eplb_off"
    with pytest.raises(ValidationError):
        merge_replies([{}, {"error": {"type": "ValidationError", "message": "m", "problems": ["a", "b"]}}])
    with pytest.raises(UnavailableError, match="RuntimeError: boom"):
        merge_status([{"error": {"type": "RuntimeError", "message": "boom"}}])


def _control(with_state: bool = True):  # type: ignore[no-untyped-def]
    state = StandinEplbState() if with_state else None
    flusher, counter, published = counting_flusher(state)
    route(counter)
    return state, EplbControl(lambda: flusher, env=StandinEnv()), flusher, published


def test_status_and_dry_run_plan_with_vllms_policy_and_move_nothing() -> None:
    state, control, _, _ = _control()
    status = control.handle(runner(state), json.dumps({"action": "status"}))
    assert status["eplb"]["policy"] == "PlannerPolicy" and status["placement_source"] == "eplb"
    assert np.asarray(status["window"]["expert_tokens"]).sum() == LAYERS * 200 * 2
    assert status["window"]["expert_tokens_total"] == status["window"]["expert_tokens"]  # nothing left the window
    before = state.model_state.physical_to_logical_map.clone()
    load = merge_status([status])["expert_tokens"]
    reply = control.handle(runner(state), {"action": "plan", "load": load})
    assert reply["dry_run"] and reply["plan_source"] == "PlannerPolicy" and reply["eplb"] is True
    assert reply["predicted_before"]["cv_max"] > 0.15 >= reply["predicted_after"]["cv_max"]
    assert reply["measured_before"]["cv_max"] == pytest.approx(reply["predicted_before"]["cv_max"])
    assert PlannerPolicy.calls[-1] == ((LAYERS, EXPERTS), SLOTS, 1, 1, 2)
    assert state.model_state.physical_to_logical_map.equal(before) and state.rearranged_with == []
    # The same load as shares per layer plans the same (rounded as given, shares were all zeros).
    shares = (np.asarray(load, dtype=float) / np.asarray(load).sum(axis=1, keepdims=True)).tolist()
    assert control.handle(runner(state), {"action": "plan", "load": shares})["phy2log"] == reply["phy2log"]


def test_apply_rearranges_with_the_plan_and_records_it() -> None:
    state, control, flusher, published = _control()
    load = np.asarray(control.handle(runner(state), {"action": "status"})["window"]["expert_tokens"])
    plan = control.handle(runner(state), {"action": "plan", "load": load.tolist()})
    reply = control.handle(runner(state), {"action": "apply", "load": load.tolist()})
    assert reply["applied"] is True and reply["stall_s"] >= 0 and reply["experts_moved"] == plan["experts_moved"] > 0
    assert reply["phy2log"] == plan["phy2log"] == state.model_state.physical_to_logical_map.tolist()
    assert state.rearranged_with == ["OneShotPlan"] and state.policy is PlannerPolicy  # the one-shot put it back
    assert state.expert_rearrangement_step == 0  # the next periodic rearrangement is an interval away
    # A caller's placement (the controller's) is what vLLM commits.
    mine = np.tile(np.arange(SLOTS)[::-1] % EXPERTS, (LAYERS, 1))
    control.handle(runner(state), {"action": "apply", "load": load.tolist(), "placement": mine.tolist()})
    assert state.model_state.physical_to_logical_map.tolist() == mine.tolist()
    log = published[-1].placement
    assert log["swaps"] == 2 and log["requests"] == {"plan/ok": 1, "apply/ok": 2}
    assert log["balance"]["predicted_before"]["cv_max"] >= 0 and "measured_before" in log["balance"]
    route(flusher.counter)
    assert flusher.flush().placement["balance"]["measured_after"]["cv_max"] >= 0  # routing after the change


def test_async_eplb_commits_later_and_the_swap_counts_when_the_map_changes() -> None:
    """vLLM 0.32 rearranges asynchronously by default: the reply said applied=false, and the window restarted and a
    swap was counted while traffic still ran on the old map."""
    state = AsyncStandinEplbState()
    flusher, counter, _ = counting_flusher(state)
    route(counter)
    control = EplbControl(lambda: flusher, env=StandinEnv())
    before = state.model_state.physical_to_logical_map.clone()
    load = merge_status([control.status(runner(state))])["expert_tokens"]
    reply = control.handle(runner(state), {"action": "apply", "load": load})
    assert (reply["applied"], reply["pending"], reply["async"]) == (False, True, True) and reply["experts_moved"] > 0
    pending = merge_status([control.status(runner(state))])
    assert np.sum(pending["expert_tokens"]) == LAYERS * 200 * 2 and pending["placement_log"]["swaps"] == 0
    assert state.model_state.physical_to_logical_map.equal(before)  # traffic still runs on the old map
    busy = control.handle(runner(state), {"action": "apply", "load": load})
    assert busy["error"]["reason"] == "eplb_busy"  # a second plan now would be dropped by vLLM's worker
    state.step()  # vLLM's worker thread plans; the step commits the first layer
    first = merge_status([control.status(runner(state))])
    log = first["placement_log"]
    assert np.sum(first["expert_tokens"]) == 0 and log["swaps"] == 1 and log["experts_moved"] == reply["experts_moved"]
    assert log["balance"]["predicted_after"] == reply["predicted_after"] and log["duration_buckets"] == [0] * len(
        log["duration_buckets"])  # fmt: skip
    route(counter)
    flusher.flush()  # a periodic flush between the layers' commits: routing went on, the map half committed
    state.step()  # the second layer, a few steps later: the same rearrangement
    done = merge_status([control.status(runner(state))])
    assert done["phy2log"] == reply["phy2log"] and done["placement_log"]["swaps"] == 1
    assert np.sum(done["expert_tokens"]) == 0  # restarted at the last layer's commit too
    assert state.rearranged_with == ["OneShotPlan"] and state.policy is PlannerPolicy


def test_a_rearrangement_vllm_makes_itself_restarts_the_routing_window() -> None:
    state, control, _, _ = _control()
    before = merge_status([control.status(runner(state))])
    assert np.sum(before["expert_tokens"]) == LAYERS * 200 * 2 and before["placement_log"] is None
    state.model_state.last_expert_load = torch.tensor(before["expert_tokens"])
    state.rearrange()  # EPLB's periodic rearrangement, with vLLM's policy: no request of ours
    after = merge_status([control.status(runner(state))])
    assert np.sum(after["expert_tokens"]) == 0  # the old routing is not re-read on the new map
    assert after["placement_log"]["swaps"] == 1 and after["placement_log"]["experts_moved"] > 0
    assert after["placement_log"]["balance"]["measured_before"]["cv_max"] == pytest.approx(before["measured"]["cv_max"])


def test_refusals_are_clear() -> None:
    _, control, flusher, published = _control(with_state=False)
    reply = control.handle(runner(None), {"action": "apply", "load": [[1] * EXPERTS] * LAYERS})
    assert reply["error"]["reason"] == "eplb_off" and "--enable-eplb" in reply["error"]["message"]
    dry = control.handle(runner(None), {"action": "plan", "load": [[1] * EXPERTS] * LAYERS})
    assert dry["eplb"] is False and dry["placement_source"] == "virtual"  # a dry run works without EPLB
    state = StandinEplbState()
    dp = control.handle(runner(state, data_parallel_size=2), {"action": "apply", "load": [[1] * EXPERTS] * LAYERS})
    assert dp["error"]["reason"] == "eplb_data_parallel"
    wrong_ranks = control.handle(runner(state), {"action": "plan", "load": [[1] * EXPERTS] * LAYERS,
                                                 "placement": [[e % EXPERTS for e in range(SLOTS)]] * LAYERS,
                                                 "placement_ranks": 7})  # fmt: skip
    assert wrong_ranks["error"]["type"] == "ValidationError" and "num_ranks is 7" in wrong_ranks["error"]["message"]
    no_load = control.handle(runner(state), {"action": "plan"})
    assert no_load["error"]["reason"] == "no_window"
    bad = control.handle(runner(state), {"action": "plan", "load": [[1] * 3]})
    assert bad["error"]["type"] == "ValidationError"
    assert control.handle(runner(state), "not json")["error"]["type"] == "JSONDecodeError"
    assert control.handle(runner(state), {"action": "explode"})["error"]["type"] == "ValidationError"
    flusher.flush()
    assert published[-1].placement["requests"] == {"apply/refused": 2, "plan/ok": 1, "plan/refused": 1,
                                                   "plan/invalid": 2}  # fmt: skip


def test_next_window_moves_vllms_counter() -> None:
    state, control, _, _ = _control()
    reply = control.handle(runner(state), {"action": "apply", "when": "next_window"})
    assert reply["scheduled"] and reply["steps_until_rearrangement"] == 32
    assert state.expert_rearrangement_step == 1000 - 32 and state.rearranged_with == []


def test_one_shot_policy_answers_once_then_restores() -> None:
    state = StandinEplbState()
    plan = np.zeros((LAYERS, SLOTS), dtype=np.int64)
    state.policy = one_shot_policy(plan, state, PlannerPolicy)
    assert issubclass(state.policy, PlannerPolicy)
    assert state.policy.rebalance_experts(None).tolist() == plan.tolist()
    assert state.policy is PlannerPolicy


def test_snapshot_json_keeps_the_placement_log() -> None:
    _, control, _, published = _control()
    control.handle(runner(StandinEplbState()), {"action": "plan", "load": [[1] * EXPERTS] * LAYERS})
    snapshot = published[-1]
    assert ExpertLoadSnapshot.from_json(snapshot.to_json()).placement == snapshot.placement


def test_pipeline_stages_refuse_a_plan_with_a_reason() -> None:
    """Status merges the stages' windows (every layer), and each stage refused that load as the wrong shape:
    a 400 naming no cause, and no plan could ever be made under pipeline parallelism."""
    import torch

    from engine.vllm_plugin import ExpertLoadCounter, Flusher, SnapshotBuilder, contiguous_rank_weights
    from engine.vllm_plugin.eplb_requests import load_for
    from exporters.vllm_metrics import NullSink

    controls = []
    for layers in ((3, 5), (7, 9)):  # the model layers each stage runs
        counter = ExpertLoadCounter(layers, EXPERTS)
        for layer in layers:
            counter.capture(layer, torch.randint(0, EXPERTS, (64, 2)))
        builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=layers, window_flushes=60,
                                  rank_weights=lambda: (contiguous_rank_weights(EXPERTS, 2), "virtual"))  # fmt: skip
        flusher = Flusher(counter, builder, NullSink(), interval_s=1.0)
        controls.append(EplbControl(lambda flusher=flusher: flusher, env=StandinEnv()))
    stages = runner(None, pipeline_parallel_size=2)
    status = merge_status([control.handle(stages, {"action": "status"}) for control in controls])
    assert status["layer_ids"] == [3, 5, 7, 9]
    request = RebalanceRequest.from_json({"dry_run": True})
    replies = [control.handle(stages, request.worker_payload(load_for(request, status))) for control in controls]
    with pytest.raises(EplbRefusedError) as refused:
        merge_replies(replies)
    assert refused.value.reason == "eplb_pipeline_parallel"


def test_a_placement_of_fractions_or_booleans_is_refused_not_truncated() -> None:
    with pytest.raises(ValidationError, match="whole numbers"):
        RebalanceRequest.from_json({"placement": [[0.9, 1.9]]})
    with pytest.raises(ValidationError, match="numbers only"):
        RebalanceRequest.from_json({"placement": {"num_ranks": 1, "phy2log": [[True, False]]}})
    placement = RebalanceRequest.from_json({"placement": [[1, 0.0]], "load": [[0.5, 2]]})
    assert placement.placement is not None and placement.placement.dtype == np.int64
    assert placement.placement.tolist() == [[1, 0]]
