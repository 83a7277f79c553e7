"""The entry router's queue as demand: scale from zero, the queue floor, and down to zero only when idle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.builder import CoreOptions, build_decision_core
from controller.capacity import Load
from controller.core import DecisionCore, sanitize_observation
from controller.entry_demand import entry_floor, entry_idle, offered_load
from controller.policy import Policy
from controller.predictive import PredictiveAdvisor
from controller.types import Advice, PolicyObservation, Reason, SliSnapshot
from tests.controller.test_core import observe, tick

ROUTER = {"endpoints": ["http://router:8080"]}


def routed_policy(min_replicas: int = 0, *, router: dict[str, object] | None = ROUTER, **scaling: int) -> Policy:
    bounds = {"min_replicas": min_replicas, "max_replicas": 10, "max_step": 4, "scale_down_cooldown_s": 180}
    document: dict[str, object] = {
        "name": "chat",
        "target": {"kind": "deployment", "namespace": "llm", "name": "chat"},
        "scaling": bounds | scaling,
    }
    if router is not None:
        document["router"] = router
    return Policy.model_validate(document)


def at_zero(at_s: float, router_queued: float | None) -> PolicyObservation:
    """A fleet at zero: no engines to scrape, only the replica count and the router's queue."""
    return PolicyObservation(
        policy="chat", observed_at_s=at_s, current_replicas=0, ready_replicas=0, router_queued=router_queued,
        errors=("no endpoints to scrape for model 'chat'",),
    )


def quiet(at_s: float, replicas: int = 1, router_queued: float | None = 0.0) -> PolicyObservation:
    """Replicas with nothing to do: no queue, nothing running, no arrivals, an empty KV cache, no refusals."""
    return observe(at_s, replicas, running_requests=0.0, kv_cache_usage=0.0, request_rate_rps=0.0,
                   router_queued=router_queued, router_refused_rps=None if router_queued is None else 0.0)  # fmt: skip


class Silent:
    """An advisor with no opinion (what a fleet at zero gives every engine-side advisor)."""

    name = "silent"

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        return Advice(replicas_needed=None, reasons=(Reason.INSUFFICIENT_DATA,))


@pytest.mark.parametrize("core", [DecisionCore(), DecisionCore([Silent()])], ids=["reactive", "no-opinion"])
def test_requests_at_the_router_scale_a_fleet_up_from_zero(core: DecisionCore) -> None:
    decision = tick(core, 1000.0, at_zero(999.0, 3.0), routed_policy())
    assert (decision.action, decision.current_replicas, decision.desired_replicas) == ("scale_up", 0, 1)
    assert decision.reasons[:2] == ("scale_up", "router_queue") and decision.apply
    assert decision.inputs["router_queued"] == 3.0
    assert "router" in decision.detail


def test_the_production_core_scales_up_from_zero_on_the_router_queue() -> None:
    core = build_decision_core(CoreOptions(tick_interval_s=15.0))
    decision = tick(core, 1000.0, at_zero(999.0, 1.0), routed_policy())
    assert (decision.action, decision.desired_replicas) == ("scale_up", 1)
    assert "router_queue" in decision.reasons
    # The replica is starting (asked for, not ready): the same queue does not ask for more.
    starting = replace(at_zero(1014.0, 1.0), current_replicas=1)
    held = tick(core, 1015.0, starting, routed_policy())
    assert (held.action, held.desired_replicas) == ("hold", 1)


def test_an_empty_router_or_an_unread_one_leaves_a_fleet_at_zero() -> None:
    for queued in (0.0, None):
        decision = tick(DecisionCore(), 1000.0, at_zero(999.0, queued), routed_policy())
        assert (decision.action, decision.desired_replicas) == ("hold", 0)


def test_the_router_queue_adds_to_the_engines_queue() -> None:
    """4 saturated replicas with 8 running each: 20 waiting, wherever they wait, need (32 + 20) / 8 -> 7."""
    only_router = tick(DecisionCore(), 1000.0, observe(999.0, 4, router_queued=20.0), routed_policy(1))
    assert (only_router.action, only_router.desired_replicas) == ("scale_up", 7)
    assert "router_queue" in only_router.reasons and "queue_depth" not in only_router.reasons
    split = tick(DecisionCore(), 1000.0, observe(999.0, 4, queue_depth=10.0, router_queued=10.0), routed_policy(1))
    assert split.desired_replicas == 7
    assert {"router_queue", "queue_depth"} <= set(split.reasons)
    engines_alone = tick(DecisionCore(), 1000.0, observe(999.0, 4, queue_depth=10.0), routed_policy(1))
    assert engines_alone.desired_replicas == 6  # (32 + 10) / 8 -> 6: the router's 10 made the difference


def test_the_router_queue_raises_the_predictive_queue_floor() -> None:
    policy = routed_policy(1)
    load = {"request_rate_rps": 10.0, "prompt_tokens_per_s": 5000.0, "output_tokens_per_s": 1000.0}
    engines = observe(999.0, 2, **load)
    with_router = replace(engines, router_queued=2000.0)  # drained within the 120 s lead time
    alone = PredictiveAdvisor().assess(policy, engines, 1000.0)
    assert alone is not None and not any(r == Reason.ROUTER_QUEUE for _, r in alone.needs)
    assessed = PredictiveAdvisor().assess(policy, with_router, 1000.0)
    assert assessed is not None
    floors = [(n, r) for n, r in assessed.needs if r == Reason.ROUTER_QUEUE]
    current_load = next(n for n, r in assessed.needs if r == Reason.CURRENT_LOAD)
    assert floors and floors[0][0] > current_load


def test_no_scale_down_to_zero_while_the_router_holds_requests() -> None:
    decision = tick(DecisionCore(), 1000.0, quiet(999.0, 1, router_queued=1.0), routed_policy())
    assert (decision.action, decision.desired_replicas) == ("hold", 1)
    assert "router_idle" not in decision.reasons


def test_down_to_zero_only_after_an_idle_router_for_the_whole_window() -> None:
    core, policy = DecisionCore(), routed_policy()
    first = tick(core, 1000.0, quiet(999.0, 1, router_queued=1.0), policy)
    assert first.desired_replicas == 1
    inside = tick(core, 1100.0, quiet(1099.0), policy)  # idle, but a replica was needed 100 s ago
    assert (inside.action, inside.desired_replicas) == ("hold", 1)
    assert "stabilization" in inside.reasons and "router_idle" in inside.reasons
    after = tick(core, 1200.0, quiet(1199.0), policy)
    assert (after.action, after.desired_replicas, after.apply) == ("scale_down", 0, True)
    assert after.reasons[:2] == ("scale_down", "low_utilization") and "router_idle" in after.reasons
    stays = tick(core, 1300.0, at_zero(1299.0, 0.0), policy)
    assert (stays.action, stays.desired_replicas) == ("hold", 0)
    wakes = tick(core, 1315.0, at_zero(1314.0, 2.0), policy)
    assert (wakes.action, wakes.desired_replicas) == ("scale_up", 1)


@pytest.mark.parametrize(
    ("policy", "obs", "why"),
    [
        (routed_policy(router=None), quiet(999.0, 1, router_queued=None), "no router in view"),
        (routed_policy(1), quiet(999.0), "min_replicas is 1"),
        (routed_policy(), quiet(999.0, 1, router_queued=None), "the router was not read"),
        (routed_policy(), replace(quiet(999.0), running_requests=1.0), "a request runs"),
        (routed_policy(), replace(quiet(999.0), request_rate_rps=None), "arrivals unknown"),
        (routed_policy(), replace(quiet(999.0), router_refused_rps=0.5), "the router refuses requests"),
        (routed_policy(), replace(quiet(999.0), router_refused_rps=None), "refusals not read yet"),
    ],
)
def test_an_idle_fleet_keeps_one_replica_unless_the_router_says_the_entry_is_idle(
    policy: Policy, obs: PolicyObservation, why: str
) -> None:
    assert not entry_idle(policy, obs), why
    assert entry_floor(policy, obs, 1, 0, ()) == (1, (), None)
    decision = tick(DecisionCore(), 1000.0, obs, policy)
    assert decision.desired_replicas == 1, why


def test_an_unreadable_router_holds_scale_downs() -> None:
    obs = replace(quiet(999.0, 3, router_queued=None), errors=("router http://router:8080: ConnectError: refused",))
    decision = tick(DecisionCore(), 1000.0, obs, routed_policy())
    assert (decision.action, decision.desired_replicas) == ("hold", 3)
    assert "partial_data" in decision.reasons


def test_a_router_queue_that_is_not_a_count_is_unknown() -> None:
    for bad in (float("nan"), float("inf"), -1.0):
        clean, invalid = sanitize_observation(quiet(999.0, router_queued=bad))
        assert clean.router_queued is None and invalid == ("router_queued",)


SERVED = {"request_rate_rps": 10.0, "prompt_tokens_per_s": 5000.0, "output_tokens_per_s": 1000.0}


def test_the_offered_load_adds_what_the_router_refused_at_the_served_lengths() -> None:
    served = observe(999.0, 2, **SERVED)
    assert offered_load(served) == Load(request_rate_rps=10.0, prompt_tokens_per_s=5000.0, output_tokens_per_s=1000.0)
    refusing = replace(served, router_refused_rps=5.0)
    assert offered_load(refusing) == Load(request_rate_rps=15.0, prompt_tokens_per_s=7500.0,
                                          output_tokens_per_s=1500.0)  # fmt: skip
    # No request counted served yet (they count as they finish): the refused requests' rate, the engines' tokens.
    idle = replace(refusing, request_rate_rps=0.0, prompt_tokens_per_s=4000.0, output_tokens_per_s=0.0)
    assert offered_load(idle) == Load(request_rate_rps=5.0, prompt_tokens_per_s=4000.0, output_tokens_per_s=0.0)
    assert offered_load(replace(refusing, request_rate_rps=None)) is None


def test_the_forecast_learns_and_sizes_for_the_requests_the_router_refused() -> None:
    """A fleet that serves 10 req/s while its router refuses 10 more: sized for 20, not for the 10 it serves."""
    policy = routed_policy(1)
    served = observe(999.0, 2, **SERVED)
    refusing = replace(served, router_refused_rps=10.0)
    alone = PredictiveAdvisor().assess(policy, served, 1000.0)
    offered = PredictiveAdvisor().assess(policy, refusing, 1000.0)
    assert alone is not None and offered is not None
    capacity = PredictiveAdvisor().capacity(policy)
    need_served = capacity.replicas_needed(Load(**SERVED))
    need_offered = capacity.replicas_needed(Load(**SERVED).scaled(2.0))
    assert need_offered > need_served
    assert dict((r, n) for n, r in alone.needs) == {Reason.CURRENT_LOAD: need_served}
    # The served load keeps its reason; the refusals' need is added with theirs.
    assert dict((r, n) for n, r in offered.needs) == {Reason.CURRENT_LOAD: need_served,
                                                      Reason.ROUTER_REFUSED: need_offered}  # fmt: skip


def test_the_forecaster_learns_the_offered_rate_at_the_served_lengths() -> None:
    policy, advisor = routed_policy(1), PredictiveAdvisor()
    for k in range(40):
        obs = replace(observe(k * 15.0, 2, **SERVED), router_refused_rps=10.0)
        if k % 4 == 3:  # now and then no request finished this tick, while tokens flowed and refusals went on
            obs = replace(obs, request_rate_rps=0.0)
        advisor.assess(policy, obs, k * 15.0 + 1.0)
    state = advisor._state[policy.name]
    # Offered: served plus refused; where none finished, the served rate is the one the prompt tokens imply.
    assert list(state.rate.history.values(4)) == pytest.approx([20.0, 20.0, 20.0, 20.0])
    assert state.mean_prompt_tokens == pytest.approx(500.0)  # 5000 tok/s over 10 served req/s, not over 20
    assert state.mean_output_tokens == pytest.approx(100.0)


def test_the_online_correction_is_against_the_served_load() -> None:
    """p99s exactly what the model predicts for the served load: no correction, whatever was refused."""
    policy, advisor = routed_policy(1), PredictiveAdvisor()
    capacity = advisor.capacity(policy)
    predicted = capacity.predict(Load(**SERVED), 2)
    for k in range(20):
        obs = replace(observe(k * 15.0, 2, **SERVED), router_refused_rps=4.0)
        sli = SliSnapshot(observed_at_s=k * 15.0, window_s=60.0, requests_in_window=600.0,
                          ttft_p99_s=predicted.ttft_p99_s, itl_p99_s=predicted.itl_p99_s)  # fmt: skip
        advisor.assess(policy, replace(obs, sli=sli), k * 15.0 + 1.0)
    assert capacity.itl_correction == pytest.approx(1.0) and capacity.ttft_correction == pytest.approx(1.0)


def test_a_refusal_rate_that_is_not_a_rate_is_unknown() -> None:
    for bad in (float("nan"), float("inf"), -1.0):
        clean, invalid = sanitize_observation(replace(quiet(999.0), router_refused_rps=bad))
        assert clean.router_refused_rps is None and invalid == ("router_refused_rps",)
