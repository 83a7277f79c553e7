"""Routing policies on hand-made replica states, each with an answer worked out by hand."""

from __future__ import annotations

import random

import pytest

from router.features import request_features
from router.policies import (
    admission,
    estimated_cost,
    least_outstanding,
    policy_named,
    predict,
    prefix_affinity,
    round_robin,
)
from router.prefix import walk
from router.types import CostModel, ReplicaState, RequestFeatures

MODEL = CostModel()  # 0.5 s TTFT, 20 ms ITL, 10 ms decode step, batch 128, KV soft limit 0.8, penalty 4


def state(name: str, **fields: object) -> ReplicaState:
    return ReplicaState(name=name, **fields)  # type: ignore[arg-type]


def features(prompt_tokens: int, blocks: tuple[int, ...] = ()) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt_tokens, prefix_blocks=blocks)


def test_round_robin_cycles_over_healthy_replicas_only() -> None:
    replicas = [state("a"), state("b", healthy=False), state("c")]
    assert [round_robin(turn, replicas).replica for turn in range(4)] == ["a", "c", "a", "c"]
    assert round_robin(0, replicas).reason == "next_in_turn"


def test_no_healthy_replica_is_a_choice_of_none() -> None:
    down = [state("a", healthy=False)]
    for choice in (round_robin(0, down), least_outstanding(down), estimated_cost(features(10), down, MODEL),
                   prefix_affinity(features(10, (1,)), down), admission(features(10), down, MODEL)):
        assert choice is not None
        assert (choice.replica, choice.reason) == (None, "no_healthy_replica")


def test_least_outstanding_breaks_ties_on_the_scraped_queue() -> None:
    replicas = [state("a", outstanding=3), state("b", outstanding=1, waiting=4), state("c", outstanding=1, running=2)]
    choice = least_outstanding(replicas)
    assert (choice.replica, choice.reason) == ("c", "fewest_outstanding")


@pytest.mark.parametrize(
    ("fields", "ttft_s"),
    [
        ({"pending_prefill_tokens": 3000}, 1.0),  # (3000 + 1000) / 4000
        ({"pending_prefill_tokens": 3000, "running": 128}, 2.0),  # a full batch doubles it
        ({"pending_prefill_tokens": 3000, "kv_usage": 0.9}, 3.0),  # half way from 0.8 to 1: 1 + 4 x 0.5
        ({"pending_prefill_tokens": 3000, "kv_usage": 1.0}, 5.0),
        ({"pending_prefill_tokens": 1000, "prefill_tokens_per_s": 1000.0}, 2.0),
    ],
)
def test_predicted_ttft(fields: dict[str, object], ttft_s: float) -> None:
    assert predict(state("a", **fields), features(1000), MODEL).ttft_s == pytest.approx(ttft_s)


def test_itl_risk_grows_with_the_running_batch() -> None:
    assert not predict(state("a", running=100), features(1), MODEL).itl_risk  # 10 ms x (1 + 101/128) = 17.9 ms
    assert predict(state("a", running=130), features(1), MODEL).itl_risk  # 10 ms x (1 + 131/128) = 20.2 ms


def test_a_profiled_itl_line_makes_a_small_batch_risky() -> None:
    # A small CPU replica: 12 ms alone, 2.5 ms more per running sequence (a replica profile's line).
    cpu = CostModel(decode_step_s=0.012, itl_per_seq_s=0.0025)
    assert not predict(state("a", running=2), features(1), cpu).itl_risk  # 12 + 2.5 x 3 = 19.5 ms
    assert predict(state("a", running=3), features(1), cpu).itl_risk  # 12 + 2.5 x 4 = 22 ms
    busy, idle = state("a", running=3, prefill_tokens_per_s=1000.0), state("b", pending_prefill_tokens=100,
                                                                             prefill_tokens_per_s=1000.0)
    choice = estimated_cost(features(100), [busy, idle], cpu)
    assert (choice.replica, choice.reason) == ("b", "avoids_itl_risk")


def test_cost_picks_the_lowest_predicted_ttft() -> None:
    replicas = [state("a", pending_prefill_tokens=4000), state("b"), state("c", pending_prefill_tokens=1000)]
    choice = estimated_cost(features(1000), replicas, MODEL)
    assert (choice.replica, choice.reason) == ("b", "lowest_predicted_ttft")
    assert choice.predicted_ttft_s == pytest.approx(0.25)
    assert choice.detail == pytest.approx({"a": 1.25, "b": 0.25, "c": 0.5})


def test_cost_avoids_itl_risk_while_the_ttft_budget_allows() -> None:
    # a: 400 / 4000 x (1 + 130/128) = 0.202 s but ITL 20.2 ms; b: (800 + 400) / 4000 = 0.3 s, ITL 10.1 ms
    replicas = [state("a", running=130), state("b", pending_prefill_tokens=800)]
    choice = estimated_cost(features(400), replicas, MODEL)
    assert (choice.replica, choice.reason) == ("b", "avoids_itl_risk")
    # b over the budget: (2000 + 400) / 4000 = 0.6 s > 0.5 s, so the fastest wins after all
    replicas = [state("a", running=130), state("b", pending_prefill_tokens=2000)]
    assert estimated_cost(features(400), replicas, MODEL).replica == "a"


def test_over_the_ttft_objective_everywhere_the_lowest_ttft_wins_itl_risk_or_not() -> None:
    # a: 2400 / 4000 x (1 + 130/128) = 1.21 s with ITL risk; b: (8000 + 2400) / 4000 = 2.6 s without
    replicas = [state("a", running=130), state("b", pending_prefill_tokens=8000)]
    choice = estimated_cost(features(2400), replicas, MODEL)
    assert (choice.replica, choice.reason) == ("a", "lowest_predicted_ttft")


def test_cached_prompt_tokens_are_not_predicted_as_prefill() -> None:
    model = CostModel()
    features = RequestFeatures(prompt_tokens=2000)
    cold = predict(ReplicaState(name="a", prefill_tokens_per_s=1000.0), features, model).ttft_s
    warm = predict(ReplicaState(name="a", prefill_tokens_per_s=1000.0, cached_prompt_tokens=1500), features, model)
    assert (cold, warm.ttft_s) == (pytest.approx(2.0), pytest.approx(0.5))
    whole = ReplicaState(name="a", prefill_tokens_per_s=1000.0, cached_prompt_tokens=4096)
    assert predict(whole, features, model).ttft_s == pytest.approx(0.001)  # the last token is always computed
    costly = CostModel(cached_token_cost=0.2)  # a hit still costs a fifth of a prefilled token
    warm_costly = ReplicaState(name="a", prefill_tokens_per_s=1000.0, cached_prompt_tokens=1500)
    assert predict(warm_costly, features, costly).ttft_s == pytest.approx(0.5 + 0.3)


def test_cost_sends_a_cached_prefix_home_unless_its_queue_costs_more() -> None:
    model = CostModel(ttft_objective_s=5.0)
    features = RequestFeatures(prompt_tokens=2000)
    holder = ReplicaState(name="holder", prefill_tokens_per_s=1000.0, cached_prompt_tokens=1500,
                          pending_prefill_tokens=1000)  # fmt: skip
    idle = ReplicaState(name="idle", prefill_tokens_per_s=1000.0)
    assert estimated_cost(features, [holder, idle], model).replica == "holder"  # 1.5 s against 2.0 s
    busy_holder = ReplicaState(name="holder", prefill_tokens_per_s=1000.0, cached_prompt_tokens=1500,
                               pending_prefill_tokens=3000)  # fmt: skip
    assert estimated_cost(features, [busy_holder, idle], model).replica == "idle"  # 3.5 s against 2.0 s


def test_admission_refuses_only_when_every_replica_is_over_budget() -> None:
    busy = [state("a", pending_prefill_tokens=4000), state("b", pending_prefill_tokens=8000)]
    refusal = admission(features(0), busy, MODEL)
    assert refusal is not None
    assert (refusal.replica, refusal.reason) == (None, "all_over_budget")
    assert refusal.retry_after_s == pytest.approx(0.5)  # best 1.0 s - 0.5 s objective
    assert admission(features(0), [*busy, state("c", pending_prefill_tokens=1000)], MODEL) is None


def test_admission_lets_through_a_request_no_wait_brings_within_the_objective() -> None:
    # 3,000 prompt tokens at 4,000 tokens/s: 0.75 s on an idle replica, over the 0.5 s objective.
    busy = [state("a", pending_prefill_tokens=4000), state("b", pending_prefill_tokens=8000, running=64)]
    assert admission(features(3000), busy, MODEL) is None
    assert estimated_cost(features(3000), busy, MODEL).replica == "a"  # and the policy picks as ever
    # 1,500 tokens fit once a backlog drains (0.375 s alone): refused, Retry-After from the best.
    refusal = admission(features(1500), busy, MODEL)
    assert refusal is not None and refusal.retry_after_s == pytest.approx((4000 + 1500) / 4000 - 0.5)
    # A replica holding most of the prompt in its prefix cache makes it fit: refused, to wait for that one.
    holder = state("c", pending_prefill_tokens=8000, cached_prompt_tokens=2800)
    assert admission(features(3000), [*busy, holder], MODEL) is not None


def test_a_long_prompt_is_judged_by_the_policys_allowance_for_its_length() -> None:
    """With a flat objective the router refused (and counted as refused demand) long prompts the controller's
    per-length objective counts as good, and steered them as if over the objective."""
    from contracts.ttft_objective import TtftAllowance

    long_prompts = CostModel(ttft_allowance=TtftAllowance(1000, 0.6))  # 1,800 tokens: 0.5 + 0.48 s
    # a: 1800 / 4000 x (1 + 130/128) = 0.907 s with ITL risk; b: (2000 + 1800) / 4000 = 0.95 s without
    replicas = [state("a", running=130), state("b", pending_prefill_tokens=2000)]
    assert estimated_cost(features(1800), replicas, MODEL).replica == "a"  # flat: over everywhere, the fastest
    choice = estimated_cost(features(1800), replicas, long_prompts)
    assert (choice.replica, choice.reason) == ("b", "avoids_itl_risk")
    # 0.45 s alone, 0.7 s behind a 1,000-token backlog: flat refuses it; within 0.98 s it is let through.
    busy = [state("c", pending_prefill_tokens=1000)]
    refusal = admission(features(1800), busy, MODEL)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(0.2)
    assert admission(features(1800), busy, long_prompts) is None
    busier = [state("c", pending_prefill_tokens=1500)]  # 900 tokens: 0.6 s, below the reference length
    assert admission(features(900), busier, long_prompts) is not None  # no allowance: refused as ever


def test_prefix_affinity_sends_a_shared_lead_to_one_replica() -> None:
    replicas = [state(name) for name in "abcd"]
    system = "You are a helpful assistant. " * 20
    owners = {prefix_affinity(request_features({"prompt": system + f"question {i}"}), replicas).replica
              for i in range(20)}  # fmt: skip
    assert len(owners) == 1
    spread = [prefix_affinity(features(64, (random.Random(i).getrandbits(64),)), replicas).replica
              for i in range(400)]  # fmt: skip
    assert all(spread.count(name) > 40 for name in "abcd"), {n: spread.count(n) for n in "abcd"}


def test_prefix_affinity_bounds_the_owners_load() -> None:
    key = 12345
    order = walk(key, ("a", "b", "c"))
    loads = {order[0]: 3, order[1]: 0, order[2]: 0}  # cap = ceil(1.25 x (3 + 1) / 3) = 2: the owner is full
    replicas = [state(name, outstanding=loads[name]) for name in "abc"]
    choice = prefix_affinity(features(64, (key,)), replicas)
    assert (choice.replica, choice.reason) == (order[1], "prefix_owner_full")
    relaxed = [state(name, outstanding=1) for name in "abc"]  # cap = ceil(1.25 x 4 / 3) = 2
    assert prefix_affinity(features(64, (key,)), relaxed).reason == "prefix_owner"


def test_prefix_affinity_moves_only_the_keys_of_a_lost_replica() -> None:
    names = ("a", "b", "c", "d")
    keys = [random.Random(i).getrandbits(64) for i in range(300)]
    before = {k: walk(k, names)[0] for k in keys}
    after = {k: walk(k, ("a", "b", "d"))[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "c" for k in moved)


def test_prefix_affinity_without_a_full_block_falls_back_to_least_outstanding() -> None:
    replicas = [state("a", outstanding=2), state("b")]
    choice = prefix_affinity(features(3), replicas)
    assert (choice.replica, choice.reason) == ("b", "no_prefix")


def test_policy_named_knows_the_four_and_refuses_others() -> None:
    replicas = [state("a", pending_prefill_tokens=9000, outstanding=5), state("b")]
    assert policy_named("cost", MODEL)(features(10), replicas, 0).replica == "b"
    assert policy_named("least-loaded", MODEL)(features(10), replicas, 0).replica == "b"
    assert policy_named("round-robin", MODEL)(features(10), replicas, 2).replica == "a"
    assert policy_named("prefix", MODEL)(features(10), replicas, 0).reason == "no_prefix"
    with pytest.raises(ValueError, match="unknown policy 'random'"):
        policy_named("random", MODEL)
