"""The scale check: with an entry router that refuses (a scale-up that ends the refusals is effective), and a p99
whose drop is within its noise."""

from __future__ import annotations

from dataclasses import replace

from controller.capacity import CapacityModel
from controller.policy import Policy
from controller.scale_check import ScaleChecker
from controller.types import PolicyObservation, Reason, SliSnapshot
from tests.controller.test_core import observe

POLICY = Policy.model_validate({"name": "chat", "target": {"kind": "deployment", "namespace": "llm", "name": "chat"},
                                "router": {"endpoints": ["http://router:8080"]}})  # fmt: skip
CAPACITY = CapacityModel()


def slow(at_s: float) -> SliSnapshot:
    """p99s 1.2x the objectives: what an overloaded fleet shows while its router refuses the rest."""
    return SliSnapshot(observed_at_s=at_s, window_s=60.0, requests_in_window=600.0, ttft_p99_s=0.6, itl_p99_s=0.024)


def refusing(at_s: float, replicas: int, served_rps: float, refused_rps: float) -> PolicyObservation:
    return observe(at_s, replicas, request_rate_rps=served_rps, prompt_tokens_per_s=500.0 * served_rps,
                   output_tokens_per_s=100.0 * served_rps, router_refused_rps=refused_rps, sli=slow(at_s))  # fmt: skip


def scale_up_judged(after: PolicyObservation) -> tuple[ScaleChecker, str | None]:
    """2 -> 4 replicas asked for the router's refusals; ``after`` is seen once the new replicas settled."""
    checker = ScaleChecker()
    checker.note_advice("chat", 4, (Reason.SCALE_UP, Reason.ROUTER_REFUSED))
    checker.observe(POLICY, refusing(0.0, 2, 10.0, 10.0), 0.0, CAPACITY)
    checker.observe(POLICY, replace(refusing(15.0, 2, 10.0, 10.0), current_replicas=4), 15.0, CAPACITY)
    checker.observe(POLICY, refusing(75.0, 4, 10.0, 10.0), 75.0, CAPACITY)  # ready
    return checker, checker.observe(POLICY, after, 200.0, CAPACITY)


def test_a_scale_up_that_ends_the_refusals_is_effective() -> None:
    checker, verdict = scale_up_judged(refusing(200.0, 4, 20.0, 0.0))  # p99 unchanged, refusals gone
    assert verdict is not None and "effective" in verdict and "no longer refuses" in verdict
    assert checker.held(POLICY, refusing(215.0, 4, 20.0, 0.0), 215.0) is None


def test_a_scale_up_that_serves_more_of_the_refused_load_is_effective() -> None:
    _, verdict = scale_up_judged(refusing(200.0, 4, 18.0, 2.0))  # served output +80 % for +100 % capacity
    assert verdict is not None and "effective" in verdict and "served output tokens/s" in verdict


def test_a_scale_up_the_router_goes_on_refusing_around_is_held() -> None:
    """A router that refuses whatever the fleet size: the added replicas serve nothing more."""
    checker, verdict = scale_up_judged(refusing(200.0, 4, 10.0, 10.0))
    assert verdict is not None and "bought nothing" in verdict
    held = checker.held(POLICY, refusing(215.0, 4, 10.0, 10.0), 215.0)
    assert held is not None and Reason.ROUTER_REFUSED in held.causes
    # A one-tick swing of the offered demand (+30 %) is not a change of load: the hold stays.
    checker.observe(POLICY, refusing(230.0, 4, 10.0, 16.0), 230.0, CAPACITY)
    assert checker.held(POLICY, refusing(230.0, 4, 10.0, 16.0), 230.0) is not None
    # The offered demand doubles and stays there: within a minute or two the hold is released.
    released = None
    for t in range(245, 425, 15):
        obs = refusing(float(t), 4, 10.0, 30.0)
        checker.observe(POLICY, obs, float(t), CAPACITY)
        if checker.held(POLICY, obs, float(t)) is None:
            released = t
            break
    assert released is not None and released - 245 <= 120


def test_giving_the_replicas_back_keeps_the_hold_and_another_change_ends_it() -> None:
    checker, verdict = scale_up_judged(refusing(200.0, 4, 10.0, 10.0))
    assert verdict is not None and "bought nothing" in verdict
    # The advisor gives the two replicas back (it asked for 2): the cause stays held at the new count.
    checker.note_advice("chat", 2, (Reason.SCALE_DOWN, Reason.SCALE_INEFFECTIVE))
    checker.observe(POLICY, refusing(215.0, 4, 10.0, 10.0), 215.0, CAPACITY)
    checker.observe(POLICY, refusing(230.0, 3, 10.0, 10.0), 230.0, CAPACITY)  # one step of the way down
    held = checker.held(POLICY, refusing(230.0, 3, 10.0, 10.0), 230.0)
    assert held is not None and held.replicas == 3
    checker.observe(POLICY, refusing(245.0, 2, 10.0, 10.0), 245.0, CAPACITY)
    assert checker.held(POLICY, refusing(245.0, 2, 10.0, 10.0), 245.0) is not None
    # Someone else scales the fleet up: the held signal is stale.
    checker.observe(POLICY, refusing(260.0, 6, 10.0, 10.0), 260.0, CAPACITY)
    assert checker.held(POLICY, refusing(260.0, 6, 10.0, 10.0), 260.0) is None


def test_a_scale_up_for_the_load_alone_keeps_the_hold_and_one_for_pressure_ends_it() -> None:
    checker, verdict = scale_up_judged(refusing(200.0, 4, 10.0, 10.0))
    assert verdict is not None and "bought nothing" in verdict
    # The load asks for one more replica, with no pressure reason: the pressure stays held.
    checker.note_advice("chat", 5, (Reason.CURRENT_LOAD, Reason.SCALE_INEFFECTIVE))
    checker.observe(POLICY, refusing(215.0, 5, 10.0, 10.0), 215.0, CAPACITY)
    held = checker.held(POLICY, refusing(215.0, 5, 10.0, 10.0), 215.0)
    assert held is not None and held.replicas == 5
    # A scale-up for pressure (a new verdict will judge it) ends the old hold.
    checker.note_advice("chat", 7, (Reason.ROUTER_REFUSED,))
    checker.observe(POLICY, refusing(230.0, 7, 10.0, 10.0), 230.0, CAPACITY)
    assert checker.held(POLICY, refusing(230.0, 7, 10.0, 10.0), 230.0) is None


def long_prompts(at_s: float, replicas: int, ttft_p99_s: float) -> PolicyObservation:
    """2 requests/s of 2,000-token prompts: the model predicts little from more replicas (prefill sets the p99)."""
    sli = SliSnapshot(observed_at_s=at_s, window_s=60.0, requests_in_window=120.0, ttft_p99_s=ttft_p99_s,
                      itl_p99_s=0.01)  # fmt: skip
    return observe(at_s, replicas, request_rate_rps=2.0, prompt_tokens_per_s=4000.0, output_tokens_per_s=200.0,
                   sli=sli)  # fmt: skip


def latency_scale_up_judged(ttft_p99_after_s: float) -> str | None:
    checker = ScaleChecker()
    checker.note_advice("chat", 4, (Reason.SCALE_UP, Reason.LATENCY_P99))
    checker.observe(POLICY, long_prompts(0.0, 2, 0.6), 0.0, CAPACITY)
    checker.observe(POLICY, replace(long_prompts(15.0, 2, 0.6), current_replicas=4), 15.0, CAPACITY)
    checker.observe(POLICY, long_prompts(75.0, 4, 0.6), 75.0, CAPACITY)  # ready
    return checker.observe(POLICY, long_prompts(200.0, 4, ttft_p99_after_s), 200.0, CAPACITY)


def test_a_gain_within_a_p99s_noise_is_not_an_effective_scale_up() -> None:
    """The model expected next to nothing (+0 %), and +2.5 % is more than a quarter of that, but is noise."""
    verdict = latency_scale_up_judged(0.585)  # 1.20 -> 1.17 of the objective
    assert verdict is not None and "bought nothing" in verdict and "predicted +0%" in verdict
    verdict = latency_scale_up_judged(0.525)  # 1.20 -> 1.05: 12.5 % lower, beyond the noise
    assert verdict is not None and "effective" in verdict and "bought nothing" not in verdict


def busy(at_s: float, replicas: int, itl_p99_s: float, ready: int | None = None) -> PolicyObservation:
    """20 requests/s of 500-token prompts: the model predicts a 38 % lower worst p99 from 2 to 6 replicas, 4 %
    from 5 to 6."""
    sli = SliSnapshot(observed_at_s=at_s, window_s=60.0, requests_in_window=1200.0, ttft_p99_s=0.1,
                      itl_p99_s=itl_p99_s)  # fmt: skip
    obs = observe(at_s, replicas, request_rate_rps=20.0, prompt_tokens_per_s=10_000.0, output_tokens_per_s=2_000.0,
                  sli=sli)  # fmt: skip
    return obs if ready is None else replace(obs, ready_replicas=ready)


def test_a_chain_of_scale_ups_is_judged_as_one_from_its_first_size() -> None:
    """Replicas slow to start: the advisor steps 2 -> 3 -> 4 -> 5 -> 6 before any is ready, while the ITL p99
    climbs.  The chain is judged once, 2 -> 6, against the p99 seen at its first step and the gain predicted
    for all of it (each step used to replace the last, so with start-ups longer than the steps' spacing no
    scale-up was ever judged)."""
    checker = ScaleChecker()
    checker.note_advice("chat", 6, (Reason.SCALE_UP, Reason.LATENCY_P99))
    checker.observe(POLICY, busy(0.0, 2, 0.024), 0.0, CAPACITY)  # 1.20 of the objective, read at the first step
    for step, at_s, itl in ((3, 15.0, 0.024), (4, 30.0, 0.026), (5, 45.0, 0.027), (6, 60.0, 0.028)):
        assert checker.observe(POLICY, replace(busy(at_s, 2, itl), current_replicas=step), at_s, CAPACITY) is None
    verdicts = [checker.observe(POLICY, busy(t, 6, 0.0216, ready=6 if t >= 600 else 2), t, CAPACITY)
                for t in (300.0, 600.0, 615.0, 700.0)]  # fmt: skip
    assert verdicts[:3] == [None, None, None]
    assert verdicts[3] is not None and verdicts[3].startswith("scale-up 2 -> 6 effective")
    assert "1.20 -> 1.08 (+10%, predicted +38%)" in verdicts[3]


def test_a_step_down_ends_the_chain_unjudged() -> None:
    """2 -> 4, then down to 3 before the new replicas are ready: nothing is judged, even once 4 are ready."""
    checker = ScaleChecker()
    checker.note_advice("chat", 4, (Reason.SCALE_UP, Reason.LATENCY_P99))
    checker.observe(POLICY, busy(0.0, 2, 0.024), 0.0, CAPACITY)
    checker.observe(POLICY, replace(busy(15.0, 2, 0.024), current_replicas=4), 15.0, CAPACITY)
    checker.note_advice("chat", 3, (Reason.SCALE_DOWN,))
    checker.observe(POLICY, replace(busy(30.0, 2, 0.024), current_replicas=3), 30.0, CAPACITY)
    assert all(checker.observe(POLICY, busy(t, 3, 0.03, ready=4), t, CAPACITY) is None for t in (200.0, 400.0))


def test_a_chain_expects_throughput_only_from_its_steps_for_pressure() -> None:
    """2 -> 4 for the refusals, then 4 -> 8 for the forecast: the served throughput is expected to grow with the
    replicas added for the refusals (+100 %), not with those the forecast added for load still to come."""
    checker = ScaleChecker()
    checker.note_advice("chat", 4, (Reason.SCALE_UP, Reason.ROUTER_REFUSED))
    checker.observe(POLICY, refusing(0.0, 2, 10.0, 10.0), 0.0, CAPACITY)
    checker.observe(POLICY, replace(refusing(15.0, 2, 10.0, 10.0), current_replicas=4), 15.0, CAPACITY)
    checker.note_advice("chat", 8, (Reason.SCALE_UP, Reason.FORECAST))
    checker.observe(POLICY, replace(refusing(30.0, 2, 10.0, 10.0), current_replicas=8), 30.0, CAPACITY)
    checker.observe(POLICY, replace(refusing(90.0, 8, 16.0, 4.0), ready_replicas=8), 90.0, CAPACITY)
    verdict = checker.observe(POLICY, replace(refusing(200.0, 8, 16.0, 4.0), ready_replicas=8), 200.0, CAPACITY)
    assert verdict is not None and verdict.startswith("scale-up 2 -> 8 effective")
    assert "served output tokens/s 1000 -> 1600 (+60%, capacity added for pressure +100%)" in verdict


def test_a_verdict_judges_both_p99s_against_the_objective_in_force() -> None:
    """TTFT p99 0.8 s at the scale-up (objective 0.5 s), 0.45 s at the verdict after the objective was tightened to
    0.25 s: the verdict compared 0.8/0.5 with 0.45/0.25 (1.60 -> 1.80) and held a scale-up that cut the p99 by 44 %."""

    def ttft(threshold_s: float) -> Policy:
        return POLICY.model_copy(update={"objectives": POLICY.objectives.model_copy(
            update={"ttft": POLICY.objectives.ttft.model_copy(update={"threshold_s": threshold_s})})})

    def seen(at_s: float, current: int, ready: int, ttft_p99_s: float) -> PolicyObservation:
        sli = SliSnapshot(observed_at_s=at_s, requests_in_window=3000, ttft_p99_s=ttft_p99_s, itl_p99_s=0.01)
        return observe(at_s, current, ready_replicas=ready, request_rate_rps=10.0, prompt_tokens_per_s=5000.0,
                       output_tokens_per_s=1000.0, running_requests=8.0, sli=sli)  # fmt: skip

    checker, before = ScaleChecker(), ttft(0.5)
    checker.note_advice("chat", 6, (Reason.LATENCY_P99,))
    checker.observe(before, seen(0.0, 4, 4, 0.8), 0.0, CAPACITY)
    checker.observe(before, seen(15.0, 6, 4, 0.8), 15.0, CAPACITY)  # the scale-up 4 -> 6 shows
    checker.observe(before, seen(30.0, 6, 6, 0.7), 30.0, CAPACITY)  # ready
    tightened = ttft(0.25)
    verdict = checker.observe(tightened, seen(120.0, 6, 6, 0.45), 120.0, CAPACITY)
    assert verdict is not None and "effective" in verdict and "3.20 -> 1.80" in verdict
    assert checker.held(tightened, seen(135.0, 6, 6, 0.45), 135.0) is None
