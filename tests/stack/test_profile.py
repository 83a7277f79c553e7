from __future__ import annotations

from stack.profile import quiet_start_rate


def test_the_quiet_start_follows_the_capacity_model_where_it_allows_a_measured_level() -> None:
    assert quiet_start_rate(2.64, 2.88, lightest=0.3) == (2.64, None)
    assert quiet_start_rate(0.3, 2.88, lightest=0.3) == (0.3, None)


def test_a_model_that_rules_out_every_measured_level_does_not_start_the_load_at_nothing() -> None:
    rate, why = quiet_start_rate(0.0, 0.3, lightest=0.3)
    assert rate == 0.3
    assert why is not None and "0.00 requests/s" in why and "0.30" in why
