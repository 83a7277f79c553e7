"""Forecast refits run after a tick's decisions (``DecisionCore.refit``), so no decision waits on a model fit; a
caller that does not run them gets them as the next tick begins, on the same history, with the same decisions."""

from __future__ import annotations

import pytest

from controller.builder import CoreOptions, build_decision_core
from controller.forecast.auto import AutoForecaster
from controller.policy import LocalTarget, Policy, Scaling
from controller.types import Decision, PolicyObservation, TickInput

TICK_S = 15.0
POLICIES = {
    f"p{i}": Policy(name=f"p{i}", target=LocalTarget(), lead_time_s=60,
                    scaling=Scaling(min_replicas=1, max_replicas=40, max_step=40, scale_down_cooldown_s=0))
    for i in range(6)
}  # fmt: skip


def observations(k: int) -> dict[str, PolicyObservation]:
    """A load that rises and falls in steps, a different phase per policy."""
    out = {}
    for i, name in enumerate(POLICIES):
        rate = 4.0 + 3.0 * (((k + 7 * i) // 20) % 4)
        out[name] = PolicyObservation(
            policy=name, observed_at_s=k * TICK_S, current_replicas=3, ready_replicas=3, queue_depth=0.0,
            running_requests=2.0, request_rate_rps=rate, prompt_tokens_per_s=rate * 200,
            output_tokens_per_s=rate * 60, kv_cache_usage=0.2,
        )  # fmt: skip
    return out


def summary(decision: Decision) -> tuple[object, ...]:
    view = decision.forecast
    return (decision.desired_replicas, decision.reasons, None if view is None else view.request_rate_rps)


def test_refits_run_after_the_decisions_and_leave_them_as_they_would_be(monkeypatch: pytest.MonkeyPatch) -> None:
    fits = 0
    refit = AutoForecaster.refit

    def counted(self: AutoForecaster) -> None:
        nonlocal fits
        fits += 1
        refit(self)

    monkeypatch.setattr(AutoForecaster, "refit", counted)
    between = build_decision_core(CoreOptions(tick_interval_s=TICK_S))  # the service's order
    lazy = build_decision_core(CoreOptions(tick_interval_s=TICK_S))  # never told: refits as the next tick begins
    fits_between = 0
    for k in range(160):
        inp = TickInput(now_s=k * TICK_S, policies=POLICIES, observations=observations(k))
        before = fits
        decided = between.tick(inp)
        assert fits == before  # the tick's decisions waited on no fit
        between.refit()
        fits_between += fits - before
        before = fits
        lazily = lazy.tick(inp)
        assert [summary(d) for d in decided.decisions] == [summary(d) for d in lazily.decisions]
    assert fits_between >= 2 * len(POLICIES)  # every forecaster refit, early and again as its history grew
    assert any(d.forecast is not None and d.forecast.request_rate_rps is not None for d in decided.decisions)
