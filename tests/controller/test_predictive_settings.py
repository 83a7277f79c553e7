"""A policy's settings changed (objectives, forecast bounds, profile, lead time): the predictive advisor keeps what it
learnt of the workload and the replicas, and resets only what the new settings make wrong."""

from __future__ import annotations

import numpy as np
import pytest

from controller.capacity import DEFAULT_PROFILE
from controller.policy import ForecastSettings, LocalTarget, Policy, Scaling
from controller.predictive import PredictiveAdvisor
from controller.types import PolicyObservation, SliSnapshot

TICK_S = 15.0
RATE = 20.0


def policy(*, ttft_s: float = 0.5, max_wape: float = 0.5, lead_time_s: int = 60, audit_forecasts: int = 40) -> Policy:
    forecast = ForecastSettings(max_wape=max_wape, audit_forecasts=audit_forecasts)
    base = Policy(
        name="p", target=LocalTarget(), lead_time_s=lead_time_s, forecast=forecast,
        scaling=Scaling(min_replicas=1, max_replicas=64, max_step=64, scale_down_cooldown_s=0),
    )  # fmt: skip
    objectives = base.objectives.model_copy(
        update={"ttft": base.objectives.ttft.model_copy(update={"threshold_s": ttft_s})}
    )
    return base.model_copy(update={"objectives": objectives})


def slow(t: float, rate: float = RATE) -> PolicyObservation:
    """Four replicas whose p99s are far over what the profile predicts for them."""
    sli = SliSnapshot(observed_at_s=t, requests_in_window=6000, itl_events_in_window=1e6, ttft_good_ratio=0.999,
                      itl_good_ratio=0.999, ttft_p99_s=0.34, itl_p99_s=0.03)  # fmt: skip
    return PolicyObservation(
        policy="p", observed_at_s=t, current_replicas=4, ready_replicas=4, request_rate_rps=rate,
        prompt_tokens_per_s=rate * 1000, output_tokens_per_s=rate * 200, queue_depth=0.0, running_requests=8.0,
        kv_cache_usage=0.4, prefill_tokens_per_s=6000.0, sli=sli,
    )  # fmt: skip


@pytest.mark.parametrize("changed", [policy(ttft_s=0.45), policy(max_wape=0.45), policy(lead_time_s=120)])
def test_a_settings_change_keeps_the_learnt_corrections(changed: Policy) -> None:
    """Eighty ticks taught the model that these replicas are slower than their profile; a stricter TTFT objective
    (or a forecast bound, or the lead time) rebuilt the advisor's state and the corrections snapped back to 1.0:
    the stricter objective shrank the fleet."""
    advisor = PredictiveAdvisor()
    for k in range(80):
        advisor.assess(policy(), slow(k * TICK_S), k * TICK_S)
    before = advisor.capacity(policy())
    learnt = (before.ttft_correction, before.itl_correction, before.prefill_speed_correction, before.prefix_hit_rate)
    assert learnt[0] > 1.3 and learnt[1] > 1.3
    after = advisor.capacity(changed)
    assert (after.ttft_correction, after.itl_correction, after.prefill_speed_correction,
            after.prefix_hit_rate) == learnt  # fmt: skip
    assert after.targets.ttft_s == changed.objectives.ttft.threshold_s
    assert advisor.history_bins("p") == 80


def test_another_profile_resets_the_corrections_of_the_old_one() -> None:
    advisor = PredictiveAdvisor()
    for k in range(40):
        advisor.assess(policy(), slow(k * TICK_S), k * TICK_S)
    faster = DEFAULT_PROFILE.model_copy(update={"itl_base_s": 0.004})
    after = advisor.capacity(policy().model_copy(update={"profile": faster}))
    assert after.profile == faster
    assert (after.ttft_correction, after.itl_correction, after.prefill_speed_correction) == (1.0, 1.0, 1.0)


def test_a_tighter_wape_bound_keeps_a_distrusted_forecast_distrusted() -> None:
    """A forecast distrusted at max_wape 0.5 (its WAPE 0.64): tightening the bound to 0.4 rebuilt the audit, which
    judged nothing until 8 new forecasts were scored, so the forecast sized the fleet again at once."""
    advisor = PredictiveAdvisor()
    rng = np.random.default_rng(1)
    for k in range(120):
        assessment = advisor.assess(policy(), slow(k * TICK_S, float(rng.choice([1.0, 40.0]))), k * TICK_S)
    assert assessment is not None and assessment.forecast_status == ("forecast_unreliable",)
    for k in range(120, 132):
        tighter = advisor.assess(policy(max_wape=0.4), slow(k * TICK_S, float(rng.choice([1.0, 40.0]))), k * TICK_S)
        assert tighter is not None and tighter.forecast_status == ("forecast_unreliable",)
    # A looser bound than the WAPE the audit holds trusts the forecast again, without waiting for new scores.
    looser = advisor.assess(policy(max_wape=5.0), slow(132 * TICK_S, 1.0), 132 * TICK_S)
    assert looser is not None and looser.forecast_status == ()


@pytest.mark.parametrize("window", [4, 7])
def test_a_short_audit_window_still_judges_the_forecast(window: int) -> None:
    """audit_forecasts below 8 (the schema allows 4) kept min_scored at 8: the window never held enough scores,
    so a forecast wrong by a factor of 40 was trusted for ever."""
    advisor = PredictiveAdvisor()
    rng = np.random.default_rng(1)
    statuses = set()
    for k in range(120):
        load = slow(k * TICK_S, float(rng.choice([1.0, 40.0])))
        assessment = advisor.assess(policy(audit_forecasts=window), load, k * TICK_S)
        assert assessment is not None
        statuses.add(assessment.forecast_status)
    assert ("forecast_unreliable",) in statuses


def test_the_policys_sizing_headroom_sizes_the_fleet() -> None:
    """``scaling.headroom`` is what the capacity model sizes to: a lower one buys more replicas for the same load
    (and an edit of it keeps what was learnt, as other settings' edits do)."""
    advisor = PredictiveAdvisor()
    for k in range(40):
        advisor.assess(policy(), slow(k * TICK_S), k * TICK_S)
    default = advisor.capacity(policy())
    tight_policy = policy().model_copy(update={"scaling": policy().scaling.model_copy(update={"headroom": 0.6})})
    tight = advisor.capacity(tight_policy)
    assert default.targets.headroom == 0.85 and tight.targets.headroom == 0.6
    assert tight.ttft_correction == default.ttft_correction
    load = slow(0.0)
    assert max(n for n, _ in advisor.assess(tight_policy, load, 40 * TICK_S).needs) \
        > max(n for n, _ in advisor.assess(policy(), load, 41 * TICK_S).needs)  # fmt: skip


@pytest.mark.parametrize("headroom", [0.4, 1.1, float("nan"), "0.8"])
def test_a_sizing_headroom_outside_half_to_one_is_refused(headroom: object) -> None:
    with pytest.raises(ValueError, match="headroom"):
        Scaling.model_validate({"headroom": headroom})
