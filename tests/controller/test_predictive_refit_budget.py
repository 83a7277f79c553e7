"""Many policies started together reach their early refits (each time the history doubles) on the same ticks:
the cheap refits of short histories share a per-tick budget of history bins, the full ones (long histories, or
young ones that fit Holt or ARIMA) run one a tick, and the ones beyond either budget wait."""

from __future__ import annotations

import pytest

from controller.forecast import ForecastConfig
from controller.forecast.auto import AutoForecaster
from controller.policy import LocalTarget, Policy, Scaling
from controller.predictive import CHEAP_REFIT_BINS, PredictiveAdvisor, PredictiveConfig
from controller.types import PolicyObservation

TICK_S = 15.0
POLICIES = [
    Policy(name=f"p{i}", target=LocalTarget(), lead_time_s=60,
           scaling=Scaling(min_replicas=1, max_replicas=50, max_step=50, scale_down_cooldown_s=0))
    for i in range(60)
]  # fmt: skip


def observe(name: str, t: float) -> PolicyObservation:
    r = 10.0 + (t // 600) % 3
    return PolicyObservation(
        policy=name, observed_at_s=t, current_replicas=4, ready_replicas=4, queue_depth=0.0, running_requests=1.0,
        request_rate_rps=r, prompt_tokens_per_s=r * 100, output_tokens_per_s=r * 50, kv_cache_usage=0.1,
    )  # fmt: skip


def test_short_refits_of_many_policies_share_a_tick_budget_and_all_catch_up() -> None:
    # Cheap refits only (a young refit that fits Holt or ARIMA is a full one: the last test here).
    cheap_only = ForecastConfig(bin_s=TICK_S, season_s=3600.0, refit_every_bins=240,
                                candidates=("last_value", "moving_average", "seasonal_naive"))  # fmt: skip
    config = PredictiveConfig(forecast=cheap_only)
    adv = PredictiveAdvisor(config)
    busiest = 0
    for k in range(220):
        now = k * TICK_S
        for policy in POLICIES:
            adv.advise(policy, observe(policy.name, now), now)
        adv.refit()  # after the tick's decisions, as the service runs it
        states = [adv._state[p.name].rate for p in POLICIES]
        refit_now = [s for s in states if s.model_name is not None and s._since_fit == 0]  # fit after this tick
        refit_bins = sum(len(s.history) for s in refit_now if len(s.history) < CHEAP_REFIT_BINS)
        busiest = max(busiest, refit_bins)
    assert 0 < busiest <= config.cheap_refit_bins_per_tick  # all at once: 60 policies' 128-bin refits on one tick
    assert adv.refits_deferred > 0
    # Deferred, not dropped: every forecaster has a model, none refit longer ago than its cadence allows.
    assert all(adv._state[p.name].rate.model_name is not None for p in POLICIES)
    assert max(adv._state[p.name].rate._since_fit for p in POLICIES) < 220 // 2


def test_a_budget_too_small_for_the_longest_short_refit_is_refused() -> None:
    with pytest.raises(ValueError, match="cheap_refit_bins_per_tick"):
        PredictiveConfig(cheap_refit_bins_per_tick=CHEAP_REFIT_BINS - 1)


YOUNG_BINS = 28
"""A history whose selection still fits neither Holt nor ARIMA (Holt joins once 20 origins follow its 10 bins)."""


def forecaster_with(bins: int) -> AutoForecaster:
    forecaster = AutoForecaster(ForecastConfig(bin_s=TICK_S, season_s=None), auto_refit=False)
    for k in range(bins):
        forecaster.observe(10.0 + k % 7)
    assert forecaster.refit_due  # never fit yet
    return forecaster


def test_full_and_short_refits_take_turns_when_both_wait() -> None:
    adv = PredictiveAdvisor(PredictiveConfig())
    longs = [forecaster_with(CHEAP_REFIT_BINS + 50) for _ in range(3)]
    youngs = [forecaster_with(YOUNG_BINS) for _ in range(3)]
    ran = []
    for tick in range(4):
        for forecaster in (longs[0], youngs[0], longs[1], youngs[1], longs[2], youngs[2]):
            before = forecaster.fits
            adv._refits.refit_if_due(forecaster, 15.0 * tick)
            if forecaster.fits > before:
                ran.append((tick, "long" if forecaster in longs else "young"))
    # Tick 0 a full refit (first in order); tick 1 the short ones that waited for it; then the other fulls,
    # one a tick: the young policies did not wait behind the whole backlog of full refits.
    assert ran == [(0, "long"), (1, "young"), (1, "young"), (1, "young"), (2, "long"), (3, "long")]


def test_a_tick_runs_full_or_short_refits_never_both_and_a_deferred_full_one_goes_first() -> None:
    adv = PredictiveAdvisor(PredictiveConfig())
    short = [forecaster_with(YOUNG_BINS) for _ in range(3)]
    full = forecaster_with(CHEAP_REFIT_BINS + 50)
    # Tick 1: short refits come first and spend budget, so the full one waits.
    for forecaster in (*short[:2], full):
        adv._refits.refit_if_due(forecaster, 15.0)
    assert [f.fits for f in (*short[:2], full)] == [1, 1, 0]
    # Tick 2: the deferred full refit goes first; the short one met before it waits behind it.
    for forecaster in (short[2], full):
        adv._refits.refit_if_due(forecaster, 30.0)
    assert (short[2].fits, full.fits) == (0, 1)
    # Tick 3: nothing full is waiting, so short refits run again.
    adv._refits.refit_if_due(short[2], 45.0)
    assert short[2].fits == 1
    assert adv.refits_deferred == 2


def test_a_young_refit_that_fits_holt_or_arima_is_budgeted_as_a_full_one() -> None:
    """Such a refit costs 7-75 ms; charged its bins (0.03 ms each), sixty of them held one tick 150 ms, and
    charged 256 bins each (two a tick) they doubled a 100-policy bench's median tick."""
    cheap, costly = forecaster_with(YOUNG_BINS), forecaster_with(60)
    assert cheap.refit_is_cheap and not costly.refit_is_cheap
    adv = PredictiveAdvisor(PredictiveConfig())
    others = [forecaster_with(60) for _ in range(2)]
    for forecaster in (costly, *others):
        adv._refits.refit_if_due(forecaster, 15.0)
    assert [f.fits for f in (costly, *others)] == [1, 0, 0]  # one full refit a tick
    assert "holt_damped" in {r.kind for r in costly.last_selection}


class _Stale:
    """A long history's forecaster, due every 240 bins, that counts its refits."""

    def __init__(self) -> None:
        self.bins_since_fit, self.fits, self.history = 240, 0, range(1000)

    @property
    def refit_due(self) -> bool:
        return self.bins_since_fit >= 240

    @property
    def refit_is_cheap(self) -> bool:
        return False

    def refit(self) -> None:
        self.bins_since_fit, self.fits = 0, self.fits + 1


def test_more_policies_than_the_budget_refits_in_a_cadence_all_refit_in_turn() -> None:
    from controller.refit_budget import RefitBudget

    budget, forecasters = RefitBudget(1, 512), {f"p{i:03d}": _Stale() for i in range(300)}
    for tick in range(3000):  # one full refit a tick: 300 policies due every 240 ticks are always a backlog
        for forecaster in forecasters.values():
            forecaster.bins_since_fit += 1
        budget.refit_all(forecasters, 15.0 * tick)
    fits = sorted(f.fits for f in forecasters.values())
    assert fits[0] >= 9 and fits[-1] - fits[0] <= 1  # each in turn (in name order, the last 60 never refit)
    assert max(f.bins_since_fit for f in forecasters.values()) <= 301
