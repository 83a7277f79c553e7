"""The forecast audit on hand-computed cases: WAPE, its noise floor, interval coverage, its verdict's hysteresis."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contracts.errors import ValidationError
from controller.forecast.audit import AuditBounds, ForecastAudit, poisson_mean_abs_deviation


def test_scores_each_forecast_when_its_bin_arrives() -> None:
    audit = ForecastAudit(AuditBounds(min_scored=2, window=10))
    audit.expect(3, point=10.0, lower=8.0, upper=12.0)
    audit.expect(4, point=10.0, lower=8.0, upper=12.0)
    assert audit.observe(2, 99.0) is None  # no forecast was made for bin 2
    first = audit.observe(3, 11.0)
    assert first is not None and first.covered
    second = audit.observe(4, 15.0)
    assert second is not None and not second.covered
    # WAPE = (1 + 5) / (11 + 15); one of two actuals inside its interval.
    assert audit.wape == pytest.approx(6 / 26)
    assert audit.coverage == pytest.approx(0.5)


def test_one_forecast_per_target_bin_and_gaps_skip_forecasts() -> None:
    audit = ForecastAudit(AuditBounds(min_scored=1))
    audit.expect(5, point=1.0, lower=0.0, upper=2.0)
    audit.expect(5, point=100.0, lower=0.0, upper=200.0)  # later forecast for the same bin: ignored
    audit.expect(6, point=1.0, lower=0.0, upper=2.0)
    assert audit.observe(6, 1.0) is not None  # bin 5 never observed: its forecast is dropped
    assert audit.scored == 1
    assert audit.wape == 0.0


def test_point_forecasts_do_not_count_towards_coverage() -> None:
    audit = ForecastAudit(AuditBounds(min_scored=1))
    audit.expect(1, point=5.0, lower=5.0, upper=5.0)
    audit.observe(1, 5.0)
    assert audit.coverage is None
    assert audit.wape == 0.0


def test_too_few_scores_or_an_idle_series_are_not_judged() -> None:
    audit = ForecastAudit(AuditBounds(min_scored=4))
    for k in range(3):
        audit.expect(k, point=1.0, lower=0.0, upper=2.0)
        audit.observe(k, 50.0)
    assert audit.wape is None and audit.reliable
    idle = ForecastAudit(AuditBounds(min_scored=2))
    for k in range(5):
        idle.expect(k, point=0.5, lower=0.0, upper=1.0)
        idle.observe(k, 0.0)
    assert idle.wape is None and idle.reliable


def test_bounds_that_could_never_judge_are_refused() -> None:
    """More scores needed than the window holds: WAPE and coverage would stay None, the forecast always trusted."""
    with pytest.raises(ValidationError, match="min_scored"):
        AuditBounds(window=5, min_scored=8)
    with pytest.raises(ValidationError, match="min_coverage"):
        AuditBounds(min_coverage=1.5)
    assert AuditBounds(window=8, min_scored=8).window == 8


def test_unreliable_past_a_bound_and_back_only_with_a_margin() -> None:
    bounds = AuditBounds(max_wape=0.5, min_coverage=0.0, window=4, min_scored=4)
    audit = ForecastAudit(bounds)
    k = 0

    def score(actual: float) -> None:
        nonlocal k
        audit.expect(k, point=10.0, lower=9.0, upper=11.0)
        audit.observe(k, actual)
        k += 1

    for _ in range(4):
        score(10.0)
    assert audit.reliable and audit.wape == 0.0
    for _ in range(4):
        score(30.0)  # error 20 per bin: WAPE 20/30 > 0.5
    assert not audit.reliable
    assert "WAPE 0.67" in audit.why_unreliable()
    score(10.0)
    score(10.0)  # window: 30, 30, 10, 10 -> WAPE 40/80 = 0.5: within the bound, not within the margin
    assert audit.wape == pytest.approx(0.5)
    assert not audit.reliable
    score(10.0)  # 20/50 = 0.4 <= 0.8 x 0.5
    assert audit.reliable


def test_coverage_below_its_bound_is_unreliable() -> None:
    audit = ForecastAudit(AuditBounds(max_wape=10.0, min_coverage=0.5, window=4, min_scored=4))
    for k in range(4):
        audit.expect(k, point=10.0, lower=9.5, upper=10.5)
        audit.observe(k, 12.0 if k % 2 else 8.0)  # never inside a too-narrow interval
    assert audit.coverage == 0.0
    assert not audit.reliable
    assert "coverage 0.00" in audit.why_unreliable()


def test_poisson_mean_absolute_deviation_on_hand_computed_means() -> None:
    assert poisson_mean_abs_deviation(0.0) == 0.0
    assert poisson_mean_abs_deviation(1.0) == pytest.approx(2 / math.e)  # 2 e^-1 1^2 / 1!
    assert poisson_mean_abs_deviation(2.5) == pytest.approx(2 * math.exp(-2.5) * 2.5**3 / 2)
    # Large means: the normal limit sigma * sqrt(2 / pi), without overflow.
    assert poisson_mean_abs_deviation(1e6) == pytest.approx(1e3 * math.sqrt(2 / math.pi), rel=1e-3)


def _audit_poisson(point_share: float, *, count_window_s: float | None, rate: float = 0.3) -> ForecastAudit:
    """Forecasts of ``point_share`` x the true rate, scored against arrivals counted over 10 s."""
    audit = ForecastAudit(AuditBounds(max_wape=0.5, window=200, min_scored=8, count_window_s=count_window_s))
    rng = np.random.default_rng(7)
    for k in range(200):
        audit.expect(k, point=point_share * rate, lower=0.0, upper=2 * rate)
        audit.observe(k, rng.poisson(rate * 10.0) / 10.0)
    return audit


def test_a_perfect_forecast_of_few_arrivals_is_trusted_once_their_noise_is_known() -> None:
    naive = _audit_poisson(1.0, count_window_s=None)  # three arrivals a window: the counts alone score ~0.45
    assert naive.wape is not None and naive.wape > 0.4
    floored = _audit_poisson(1.0, count_window_s=10.0)
    assert floored.noise_floor is not None and floored.noise_floor == pytest.approx(naive.wape, abs=0.08)
    assert floored.excess_wape is not None and floored.excess_wape < 0.1 and floored.reliable


def test_a_wrong_forecast_stays_distrusted_above_the_noise_floor() -> None:
    wrong = _audit_poisson(3.0, count_window_s=10.0)  # three times the rate
    assert wrong.excess_wape is not None and wrong.excess_wape > 0.5
    assert not wrong.reliable
    assert "above the noise floor" in wrong.why_unreliable()


def _distrusted_share(per_min: float, point_share: float = 1.0, ticks: int = 2000) -> tuple[float, ForecastAudit]:
    """A forecast of ``point_share`` x the true rate, scored as the controller does (arrivals counted over 60 s)."""
    rate = per_min / 60.0
    audit = ForecastAudit(AuditBounds(max_wape=0.5, window=40, count_window_s=60.0))
    rng = np.random.default_rng(1)
    distrusted = 0
    for k in range(ticks):
        audit.expect(k, point=point_share * rate, lower=0.0, upper=0.0)  # point only: coverage not judged
        audit.observe(k, rng.poisson(rate * 60.0) / 60.0)
        distrusted += not audit.reliable
    return distrusted / ticks, audit


@pytest.mark.parametrize("per_min", [0.3, 0.5])
def test_a_perfect_forecast_of_a_quiet_service_is_trusted(per_min: float) -> None:
    """The floor taken from each actual (E|N - n| at mean n) is about half the noise a perfect forecast scores below
    three arrivals a window: at 0.3 requests a minute it was distrusted on 95 % of ticks."""
    share, _ = _distrusted_share(per_min)
    assert share < 0.05


def test_a_forecast_too_low_for_a_quiet_service_is_still_distrusted() -> None:
    """The floor is the noise the forecast's own rate would show: one too low claims less noise, not more."""
    share, _ = _distrusted_share(0.3, point_share=1 / 3)
    assert share > 0.3


def test_the_noise_floor_of_busy_traffic_is_what_its_counts_give() -> None:
    """At 600 requests a minute the floor is the normal limit sqrt(2 / (pi x 600)), a forecast right is trusted and
    one twice too high is not."""
    share, audit = _distrusted_share(600.0, ticks=200)
    assert share == 0.0
    assert audit.noise_floor == pytest.approx(math.sqrt(2 / (math.pi * 600)), rel=0.05)
    share, _ = _distrusted_share(600.0, point_share=2.0, ticks=200)
    assert share > 0.9


def test_last_values_of_a_quiet_service_are_judged_by_their_mean_rate() -> None:
    """On a few arrivals a window the selection picks forecasts near the median count, mostly 0: a 0 claims no noise,
    and the floor summed forecast by forecast held the counting noise against last value on 83 % of ticks (its WAPE,
    1.46, is what a perfect forecast scores)."""
    rate = 0.3 / 60.0
    audit = ForecastAudit(AuditBounds(max_wape=0.5, window=40, count_window_s=60.0))
    rng = np.random.default_rng(1)
    last, distrusted = 0.0, 0
    for k in range(2000):
        audit.expect(k, point=last, lower=0.0, upper=0.0)
        last = rng.poisson(rate * 60.0) / 60.0
        audit.observe(k, last)
        distrusted += not audit.reliable
    assert audit.wape is not None and audit.wape > 1.0  # the counts' noise: twice over, for a lagged count
    assert distrusted / 2000 < 0.2
