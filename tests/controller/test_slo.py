"""SLI, error-budget and burn-rate math against the SRE workbook's numbers."""

from __future__ import annotations

import pytest

from controller import slo
from controller.policy import parse_duration_s


def test_good_ratio() -> None:
    assert slo.good_ratio(99, 100) == pytest.approx(0.99)
    assert slo.good_ratio(0, 0) is None  # no traffic is not a perfect SLI
    assert slo.good_ratio(101, 100) == 1.0  # counters read a moment apart
    with pytest.raises(ValueError, match="counts must be >= 0"):
        slo.good_ratio(-1, 10)


def test_burn_rate_and_budget() -> None:
    assert slo.error_budget(0.99) == pytest.approx(0.01)
    assert slo.burn_rate(0.99, 0.99) == pytest.approx(1.0)
    assert slo.burn_rate(0.95, 0.99) == pytest.approx(5.0)
    assert slo.burn_rate(1.0, 0.999) == 0.0
    assert slo.error_budget_remaining(0.995, 0.99) == pytest.approx(0.5)
    assert slo.error_budget_remaining(0.98, 0.99) == pytest.approx(-1.0)  # overspent, kept negative
    with pytest.raises(ValueError, match=r"target must be in \(0, 1\)"):
        slo.burn_rate(0.9, 1.0)
    with pytest.raises(ValueError, match=r"good ratio must be in \[0, 1\]"):
        slo.burn_rate(1.2, 0.99)


@pytest.mark.parametrize(
    ("window", "fraction", "expected"),
    [("1h", 0.02, 14.4), ("6h", 0.05, 6.0), ("1d", 0.10, 3.0), ("3d", 0.10, 1.0), ("30d", 1.0, 1.0)],
)
def test_workbook_thresholds_for_30_days(window: str, fraction: float, expected: float) -> None:
    seconds = parse_duration_s(window)
    assert slo.burn_rate_threshold(seconds, fraction, 30 * 86400) == pytest.approx(expected)


def test_thresholds_scale_with_the_compliance_window() -> None:
    # A 7-day window: 2 % of its budget in 1 h is 0.02 * 168 = 3.36x.
    assert slo.burn_rate_threshold(3600, 0.02, 7 * 86400) == pytest.approx(3.36)
    with pytest.raises(ValueError, match="exceeds the compliance window"):
        slo.burn_rate_threshold(31 * 86400, 0.1, 30 * 86400)
    with pytest.raises(ValueError, match="budget fraction"):
        slo.burn_rate_threshold(3600, 0.0, 30 * 86400)


def test_standard_windows_are_derived() -> None:
    windows = slo.standard_burn_rate_windows()
    table = [(w.long_window, w.short_window, w.severity, round(w.burn_rate, 9)) for w in windows]
    assert table == [
        ("1h", "5m", "page", 14.4),
        ("6h", "30m", "page", 6.0),
        ("1d", "2h", "ticket", 3.0),
        ("3d", "6h", "ticket", 1.0),
    ]
    for w in windows:
        assert w.short_window_s * slo.SHORT_WINDOW_DIVISOR == w.long_window_s
        assert w.burn_rate == pytest.approx(w.budget_fraction * 30 * 86400 / w.long_window_s)
    # Derived, not a table: a 7-day window gives other factors (and holds its slowest pair at 1x).
    week = slo.standard_burn_rate_windows(7 * 86400)
    assert [(w.long_window, round(w.burn_rate, 6)) for w in week] == [("1h", 3.36), ("6h", 1.4), ("3d", 1.0)]


@pytest.mark.parametrize(
    ("days", "factors"),
    [
        (28, {"1h": 13.44, "6h": 5.6, "1d": 2.8, "3d": 1.0}),  # 3d/6h would be 0.93x: raised to 1x
        (7, {"1h": 3.36, "6h": 1.4, "3d": 1.0}),  # 3d/6h would be 0.23x; 1d/2h (0.7x) is left out
        (90, {"1h": 43.2, "6h": 18.0, "1d": 9.0, "3d": 1.0}),  # 3d/6h would be 3x: lowered to 1x
        (30, {"1h": 14.4, "6h": 6.0, "1d": 3.0, "3d": 1.0}),
    ],
)
def test_the_slowest_pair_tickets_any_burn_that_would_exhaust_the_budget(days: int, factors: dict[str, float]) -> None:
    """A burn above 1x spends the budget before the window ends: whatever the window, the 3d/6h ticket sees it."""
    windows = slo.standard_burn_rate_windows(days * 86400)
    assert {w.long_window: round(w.burn_rate, 6) for w in windows} == factors
    slowest = windows[-1]
    assert (slowest.long_window, slowest.severity, slowest.burn_rate) == ("3d", "ticket", 1.0)
    assert slowest.budget_fraction == pytest.approx(3 / days)  # what 1x spends of the budget in 3 days
    assert slo.objective_status({"3d": 0.975, "6h": 0.975}, 0.99, days * 86400).firing == (slowest,)  # 2.5x


def test_windows_below_one_x_are_left_out() -> None:
    """A burn rate <= 1 never exhausts the budget: an alert below 1x would fire while the SLO is met."""
    week_dropped = slo.dropped_burn_rate_windows(7 * 86400)
    assert [(w.long_window, round(w.burn_rate, 6)) for w in week_dropped] == [("1d", 0.7)]
    for days in (1, 2, 3, 5, 7, 10, 14, 28, 30, 90):
        windows = slo.standard_burn_rate_windows(days * 86400)
        assert all(w.burn_rate >= slo.MIN_ALERT_BURN_RATE - 1e-9 for w in windows), days
        kept_and_dropped = windows + slo.dropped_burn_rate_windows(days * 86400)
        # Windows longer than the compliance window are in neither list.
        assert all(w.long_window_s <= days * 86400 for w in kept_and_dropped)
    # 1 day: 1h would page at 0.48x, 6h at 0.2x, 1d ticket at 0.1x: nothing is left.
    assert slo.standard_burn_rate_windows(86400) == ()
    assert [w.long_window for w in slo.dropped_burn_rate_windows(86400)] == ["1h", "6h", "1d"]
    # 50 hours is the shortest window that keeps the 1h page (at exactly 1x), and its slowest pair (1d/2h, 3d does
    # not fit) at 1x; 30 days keeps 3d at 1x.
    fifty_hours = slo.standard_burn_rate_windows(50 * 3600)
    assert [(w.long_window, w.burn_rate) for w in fifty_hours] == [("1h", 1.0), ("1d", 1.0)]
    assert slo.dropped_burn_rate_windows(30 * 86400) == ()


def test_alert_condition_and_error_ratio() -> None:
    page = slo.standard_burn_rate_windows()[0]
    assert slo.error_ratio_threshold(page.burn_rate, 0.99) == pytest.approx(0.144)
    assert slo.is_burning(20.0, 15.0, page.burn_rate)
    assert not slo.is_burning(20.0, 2.0, page.burn_rate)  # recovered: the short window stops the alert
    assert not slo.is_burning(14.4, 20.0, page.burn_rate)  # strictly above


def test_format_duration() -> None:
    assert [slo.format_duration(s) for s in (300, 3600, 5400, 86400, 604800, 45)] == [
        "5m",
        "1h",
        "90m",
        "1d",
        "1w",
        "45s",
    ]
    with pytest.raises(ValueError, match="positive whole number"):
        slo.format_duration(1.5)
    with pytest.raises(ValueError, match="positive whole number"):
        slo.format_duration(0)


def test_derive_rejects_windows_not_divisible_into_short_windows() -> None:
    with pytest.raises(ValueError, match="multiple of 12"):
        slo.BurnRateWindow.derive(long_window="5s", budget_fraction=0.1, severity="page", compliance_window_s=86400)


def test_burn_rates_by_window() -> None:
    rates = slo.burn_rates_by_window({"5m": 0.9, "1h": 1.0000001, "30d": 0.995}, 0.99)
    assert rates == {"5m": pytest.approx(10.0), "1h": 0.0, "30d": pytest.approx(0.5)}


def test_objective_status_fires_only_when_both_windows_burn() -> None:
    ratios = {"5m": 0.8, "1h": 0.8, "30m": 0.999, "6h": 0.9, "2h": 0.99, "1d": 0.99, "30d": 0.996}
    status = slo.objective_status(ratios, 0.99, 30 * 86400)
    assert status.compliance_window == "30d"
    assert status.good_ratio == 0.996
    assert status.error_budget_remaining == pytest.approx(0.6)
    assert status.burn_rates["5m"] == pytest.approx(20.0)
    # 1h/5m burns at 20 > 14.4: page. 6h burns at 10 > 6 but its 30m window recovered: no page.
    # 1d/2h at 1.0 is under 3; 3d/6h has no 3d ratio, so it is not evaluated.
    assert [(w.long_window, w.severity) for w in status.firing] == [("1h", "page")]


def test_objective_status_without_data() -> None:
    status = slo.objective_status({}, 0.99, 30 * 86400)
    assert status.good_ratio is None
    assert status.error_budget_remaining is None
    assert status.firing == ()


def test_objective_status_matches_windows_by_seconds_not_spelling() -> None:
    """Sources key ratios by the policy's own window (``7d``); format_duration spells it ``1w``."""
    ratios = {"5m": 0.9, "1h": 0.9, "7d": 0.995}
    status = slo.objective_status(ratios, 0.99, 7 * 86400)
    assert status.compliance_window == "7d"
    assert status.good_ratio == 0.995
    assert status.error_budget_remaining == pytest.approx(0.5)
    assert [w.long_window for w in status.firing] == ["1h"]
    # Other spellings of the alert windows are found too; a key that is no duration is skipped.
    spelled = slo.objective_status({"300s": 0.8, "60m": 0.8, "30d": 0.999, "all": 0.5}, 0.99, 30 * 86400)
    assert spelled.compliance_window == "30d"
    assert [w.long_window for w in spelled.firing] == ["1h"]
    assert spelled.burn_rates["all"] == pytest.approx(50.0)
    assert slo.objective_status({}, 0.99, 7 * 86400).compliance_window == "1w"


def test_misses_beyond_chance_is_a_one_sided_binomial_test() -> None:
    # At 0.99: 2 misses in 100 happen by chance 26 % of the time, 5 in 100 0.3 %.
    assert not slo.misses_beyond_chance(0.98, 100, 0.99)
    assert slo.misses_beyond_chance(0.95, 100, 0.99)
    assert not slo.misses_beyond_chance(1.0, 10_000, 0.99)
    # 1.3 % of 1,300 gaps (17 against 13 expected) is chance; 2 % of them (26) is not.
    assert not slo.misses_beyond_chance(0.987, 1300, 0.99)
    assert slo.misses_beyond_chance(0.98, 1300, 0.99)
    # About the same in clumps of four (one stall delaying four running requests): 325 draws, 6 misses
    # against 3.25 expected, which chance gives 11 % of the time.
    assert not slo.misses_beyond_chance(0.981, 1300, 0.99, clump=4)
    assert slo.misses_beyond_chance(0.96, 1300, 0.99, clump=4)
    assert not slo.misses_beyond_chance(0.5, 0.5, 0.99)  # less than one event


@pytest.mark.parametrize("target", [0.9, 0.99, 0.999])
def test_misses_beyond_chance_agrees_with_the_binomial_tail_everywhere(target: float) -> None:
    """The test against scipy.stats' binomial survival function, over counts and miss shares."""
    from scipy.stats import binom

    for events in (1, 2, 7, 40, 100, 1300, 12_345, 1_000_000):
        for misses in sorted({1, 2, 3, events // 50, events // 10, events // 2, events}):
            if not 1 <= misses <= events:
                continue
            good = 1.0 - misses / events
            expected = float(binom.sf(misses - 1, events, 1.0 - target)) < slo.MISS_SIGNIFICANCE
            assert slo.misses_beyond_chance(good, events, target) is expected, (events, misses)


def test_the_low_traffic_guard_counts_requests_over_the_short_window() -> None:
    """20 requests: one slow among them is 5 %, short of the 14.4 % the fastest page needs at 99 %."""
    assert slo.MIN_ALERT_REQUESTS == 20
    assert not slo.enough_requests(19 / 300, 300)  # 19 in 5 minutes
    assert slo.enough_requests(20 / 300, 300)
    assert slo.enough_requests(5 / 60, 7200)  # 5 a minute: 600 over a ticket's 2 h
    assert not slo.enough_requests(0.0005, 6 * 3600)  # 43 a day: 11 in 6 h
