"""Tokens flowing before any request has finished: requests count as they finish, prompt tokens as they are
admitted, so a ramp from idle or long answers show a request rate of 0 under real load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.capacity import Load
from controller.entry_demand import admitted_load
from controller.predictive import Assessment
from controller.types import LoadHistory, Reason
from tests.controller.test_predictive_gaps import POLICY, TICK_S, advisor, flat_observation


def _current_load_need(assessment: Assessment | None) -> int:
    assert assessment is not None
    return next(n for n, r in assessment.needs if r == Reason.CURRENT_LOAD)


def test_tokens_before_any_request_finishes_are_sized_from_the_lengths_known() -> None:
    adv = advisor()
    for i in range(20):
        adv.assess(POLICY, flat_observation(i * TICK_S, 10.0), i * TICK_S)
    steady = _current_load_need(adv.assess(POLICY, flat_observation(20 * TICK_S, 10.0), 20 * TICK_S))
    at_s = 21 * TICK_S
    none_finished = replace(flat_observation(at_s, 10.0), request_rate_rps=0.0)  # the same tokens, none finished
    assert steady > 0
    assert _current_load_need(adv.assess(POLICY, none_finished, at_s)) == steady


def test_an_idle_fleet_and_one_without_known_lengths_need_nothing_from_the_load() -> None:
    adv = advisor()
    idle = replace(flat_observation(0.0, 0.0), output_tokens_per_s=0.0)
    assert _current_load_need(adv.assess(POLICY, idle, 0.0)) == 0
    unfinished = Load(request_rate_rps=0.0, prompt_tokens_per_s=1000.0, output_tokens_per_s=50.0)
    assert admitted_load(unfinished, None) == unfinished  # no lengths learnt yet: nothing to size with
    assert admitted_load(unfinished, 100.0).request_rate_rps == pytest.approx(10.0)
    served = Load(request_rate_rps=2.0, prompt_tokens_per_s=1000.0, output_tokens_per_s=50.0)
    assert admitted_load(served, 100.0) == served  # requests counted: the rate as observed


def test_the_forecaster_learns_the_admitted_rate_while_none_finishes() -> None:
    """Long answers: for a minute the tokens flow and no request finishes.  The forecaster learnt a rate of 0
    for those bins, and its forecast fell toward nothing under the same load."""
    adv = advisor()
    for i in range(40):
        adv.assess(POLICY, flat_observation(i * TICK_S, 10.0), i * TICK_S)
    assessment = None
    for i in range(40, 48):
        at_s = i * TICK_S
        assessment = adv.assess(POLICY, replace(flat_observation(at_s, 10.0), request_rate_rps=0.0), at_s)
    assert assessment is not None and assessment.forecast is not None
    assert assessment.forecast.request_rate_rps == pytest.approx(10.0, rel=0.05)


def test_a_warm_start_reads_bins_where_none_finished_as_the_live_ticks_do() -> None:
    """The stored history keeps the engines' rates as read: its last minute, none finished, seeds the same rate."""
    rates = [10.0] * 40 + [0.0] * 4
    adv = advisor()
    assert adv.warm_start(POLICY, LoadHistory(rates_rps=rates, prompt_tokens_per_s=[1000.0] * 44,
                                              output_tokens_per_s=[500.0] * 44))  # fmt: skip
    assessment = adv.assess(POLICY, flat_observation(44 * TICK_S, 10.0), 44 * TICK_S)
    assert assessment is not None and assessment.forecast is not None
    assert assessment.forecast.request_rate_rps == pytest.approx(10.0, rel=0.05)
