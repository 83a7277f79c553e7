"""Forecast refits run after a tick's decisions (``DecisionCore.refit``), so no decision waits on a model fit; a
caller that does not run them gets them as the next tick begins, on the same history, with the same decisions:
across a settings change and a warm start too.  A refit that raises stops no other policy's."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controller.builder import CoreOptions, build_decision_core
from controller.core import DecisionCore
from controller.forecast.auto import AutoForecaster
from controller.policy import LocalTarget, Policy, Scaling
from controller.types import Decision, LoadHistory, PolicyObservation, TickInput

TICK_S = 15.0


def policy(name: str, lead_time_s: int = 60) -> Policy:
    return Policy(name=name, target=LocalTarget(), lead_time_s=lead_time_s,
                  scaling=Scaling(min_replicas=1, max_replicas=40, max_step=40, scale_down_cooldown_s=0))  # fmt: skip


POLICIES = {f"p{i}": policy(f"p{i}") for i in range(6)}


def rate(k: int, i: int) -> float:
    """A load that rises and falls in steps, a different phase per policy."""
    return 4.0 + 3.0 * (((k + 7 * i) // 20) % 4)


def observations(k: int, policies: dict[str, Policy]) -> dict[str, PolicyObservation]:
    out = {}
    for i, name in enumerate(sorted(policies)):
        r = rate(k, i)
        out[name] = PolicyObservation(
            policy=name, observed_at_s=k * TICK_S, current_replicas=3, ready_replicas=3, queue_depth=0.0,
            running_requests=2.0, request_rate_rps=r, prompt_tokens_per_s=r * 200, output_tokens_per_s=r * 60,
            kv_cache_usage=0.2,
        )  # fmt: skip
    return out


def summary(decision: Decision) -> tuple[object, ...]:
    view = decision.forecast
    return (decision.desired_replicas, decision.reasons, None if view is None else view.request_rate_rps)


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each refit, by its forecaster's model before it (counts them)."""
    seen: list[str] = []
    refit = AutoForecaster.refit

    def counted(self: AutoForecaster) -> None:
        seen.append(str(self.model_name))
        refit(self)

    monkeypatch.setattr(AutoForecaster, "refit", counted)
    return seen


@dataclass
class SideBySide:
    """What a core told to refit after each tick did beside one never told, on the same inputs."""

    refits: int = 0
    """Refits the first core ran after its ticks."""
    waited: list[int] = field(default_factory=list)
    """Ticks whose decisions waited on a fit (the first core's)."""
    differed: list[int] = field(default_factory=list)
    """Ticks where the two cores decided differently."""
    last: tuple[Decision, ...] = ()
    """The first core's last decisions."""
    seeded: tuple[int, int] = (0, 0)
    """Advisors each core's warm start seeded."""


def run_both(ticks: int, fits: list[str], *, change_at: int | None = None, warm_at: int | None = None) -> SideBySide:
    between = build_decision_core(CoreOptions(tick_interval_s=TICK_S))  # the service's order
    lazy = build_decision_core(CoreOptions(tick_interval_s=TICK_S))
    policies = dict(POLICIES)
    seen = SideBySide()
    for k in range(ticks):
        if k == change_at:
            policies["p0"] = policy("p0", lead_time_s=120)  # another horizon: a new forecaster
        if k == warm_at:
            policies["late"] = policy("late")
            seeded = [rate(j, 6) for j in range(k - 60, k)]
            history = LoadHistory(rates_rps=seeded, prompt_tokens_per_s=[r * 200 for r in seeded],
                                  output_tokens_per_s=[r * 60 for r in seeded])  # fmt: skip
            seen.seeded = (between.warm_start(policies["late"], history), lazy.warm_start(policies["late"], history))
        inp = TickInput(now_s=k * TICK_S, policies=policies, observations=observations(k, policies))
        before = len(fits)
        decided = between.tick(inp).decisions
        if len(fits) != before:
            seen.waited.append(k)
        between.refit()
        seen.refits += len(fits) - before
        if [summary(d) for d in decided] != [summary(d) for d in lazy.tick(inp).decisions]:
            seen.differed.append(k)
        seen.last = decided
    return seen


def test_refits_run_after_the_decisions_and_leave_them_as_they_would_be(fits: list[str]) -> None:
    seen = run_both(160, fits)
    assert (seen.waited, seen.differed) == ([], [])
    assert seen.refits >= 2 * len(POLICIES)  # every forecaster refit, early and again as it grew


def test_a_settings_change_and_a_warm_start_between_ticks_decide_the_same_either_way(fits: list[str]) -> None:
    seen = run_both(160, fits, change_at=100, warm_at=120)
    assert (seen.waited, seen.differed, seen.seeded) == ([], [], (1, 1))
    by_policy = {d.policy: d for d in seen.last}
    changed, late = by_policy["p0"].forecast, by_policy["late"].forecast
    assert changed is not None and changed.horizon_s == 120.0  # the new horizon's forecaster decided
    assert late is not None and late.request_rate_rps is not None  # the warm-started policy forecast


def test_a_new_horizon_forecasts_at_once_and_is_refitted_after_the_tick(fits: list[str]) -> None:
    core = build_decision_core(CoreOptions(tick_interval_s=TICK_S))
    policies = dict(POLICIES)
    for k in range(101):
        if k == 100:
            policies["p0"] = policy("p0", lead_time_s=120)
        effects = core.tick(TickInput(now_s=k * TICK_S, policies=policies, observations=observations(k, policies)))
        core.refit()
    changed = effects.for_policy("p0")
    assert changed.forecast is not None and changed.forecast.request_rate_rps is not None, changed.reasons
    assert fits[-1] == "moving_average_8"  # the quick fit it forecast from, refitted once the tick was out


def test_a_refit_that_raises_stops_no_other_policys_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    refit = AutoForecaster.refit
    broken: set[int] = set()

    def failing(self: AutoForecaster) -> None:
        if id(self) in broken:
            raise FloatingPointError("singular matrix")
        refit(self)

    monkeypatch.setattr(AutoForecaster, "refit", failing)
    core: DecisionCore = build_decision_core(CoreOptions(tick_interval_s=TICK_S))
    advisor = core.advisors[0].predictive  # type: ignore[attr-defined]
    for k in range(80):
        if k == 1:
            broken.add(id(advisor._state["p0"].rate))  # p0's every refit fails from now on
        effects = core.tick(TickInput(now_s=k * TICK_S, policies=POLICIES, observations=observations(k, POLICIES)))
        core.refit()
    first, *others = (effects.for_policy(name) for name in sorted(POLICIES))
    assert str(first.inputs["sizing.predictive.forecast_refit_error"]).startswith("FloatingPointError")
    assert all(d.forecast is not None and d.forecast.request_rate_rps is not None for d in others)
    assert all("sizing.predictive.forecast_refit_error" not in d.inputs for d in others)


def test_a_failed_refit_is_reported_until_one_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.forecast.models import DampedHolt

    fit, failing = DampedHolt.fit, [False]

    def flaky(self: DampedHolt, history: object) -> None:
        if failing[0]:
            raise FloatingPointError("singular matrix")
        fit(self, history)  # type: ignore[arg-type]

    monkeypatch.setattr(DampedHolt, "fit", flaky)
    core: DecisionCore = build_decision_core(CoreOptions(tick_interval_s=TICK_S))
    reported: list[set[str]] = []
    for k in range(700):
        failing[0] = 200 <= k < 260
        effects = core.tick(TickInput(now_s=k * TICK_S, policies=POLICIES, observations=observations(k, POLICIES)))
        core.refit()
        error = "sizing.predictive.forecast_refit_error"
        reported.append({name for name in POLICIES if error in effects.for_policy(name).inputs})
    assert not set().union(*reported[:200])
    assert reported[260]  # the fits work again, but these policies' last refit failed and none has run since
    assert not reported[-1]  # each refitted since
