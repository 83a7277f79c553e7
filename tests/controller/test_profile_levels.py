"""The rate a replica holds up to: what the profiled replicas held, their levels pooled (moeslo profile, moeslo up)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.capacity import DEFAULT_PROFILE
from controller.profile_levels import GAP_SHARE, held_rate_rps, lightest_failed_rps, with_held_ceiling


def _level(rate: float, requests: int, within: float | None) -> dict[str, Any]:
    return {"requests_per_s": rate, "requests": requests, "within_objectives": within}


def _replica(last_within: float) -> list[dict[str, Any]]:
    return [_level(0.3, 1, 0.0), _level(1.0, 5, 1.0), _level(3.0, 15, 1.0), _level(8.0, 40, last_within)]


def test_the_held_rate_runs_from_the_last_level_held_towards_the_first_that_failed() -> None:
    # The lightest level's single miss is passed over (2 pooled requests); 8 req/s kept 90 %.
    assert held_rate_rps([_replica(0.9), _replica(0.9)]) == pytest.approx(3.0 + 5.0 * 0.01 / 0.1)


def test_replicas_are_pooled_before_the_share_is_taken() -> None:
    # 76 of 80 at 8 req/s pooled: four misses where 0.8 are expected, so the rate stops short of 8.
    one, other = _replica(1.0), _replica(36 / 40)
    assert 3.0 < held_rate_rps([one, other]) < 8.0  # type: ignore[operator]
    assert held_rate_rps([_replica(1.0), _replica(1.0)]) == 8.0  # every level held: the heaviest measured


def test_a_request_miss_that_chance_explains_does_not_fail_a_level() -> None:
    # One miss in 80 requests (0.8 expected at 99 %) is 98.75 %, yet says nothing against 99 %.
    assert held_rate_rps([_replica(1.0), _replica(39 / 40)]) == 8.0


def test_gap_shares_are_taken_as_measured_against_half_the_itl_budget() -> None:
    # Gaps, hundreds a level, are not judged against chance, and a level may use half the SLI's 1 %:
    # 1 of 300 over holds, 2 of 300 (0.67 %) does not (the run's 30 s SLI windows swing around a
    # level's mean, and the run adds the rest of the stack to the CPUs the profile had to itself).
    assert GAP_SHARE == 0.995

    def level(rate: float, over: int) -> dict[str, Any]:
        return {**_level(rate, 15, 1.0), "token_gaps": 300, "gaps_within_objective": 1 - over / 300}

    assert held_rate_rps([[level(1.0, 0), level(3.0, 1)]]) == 3.0
    assert held_rate_rps([[level(1.0, 0), level(3.0, 2)]]) == pytest.approx(1.0 + 2.0 * 0.005 / (2 / 300))


def test_the_carry_starts_from_the_held_levels_own_misses() -> None:
    # 3 req/s held with 0.3 % of its gaps over, 8 req/s missed with 0.8 %: the budget used (0.6, then
    # 1.6 of the 0.5 % a level may use) reaches the whole of it at 3 + 5 * 0.4 / 1.0, not at
    # 3 + 5 * 1 / 1.6 as from no misses.
    def level(rate: float, over: float) -> dict[str, Any]:
        return {**_level(rate, 40, 1.0), "token_gaps": 2000, "gaps_within_objective": 1 - over}

    replica = [level(1.0, 0.0), level(3.0, 0.003), level(8.0, 0.008)]
    assert held_rate_rps([replica]) == pytest.approx(5.0)
    # A held level already past 1 % of its requests (within chance) carries nothing towards the one
    # that missed.
    past = [_level(1.0, 40, 1.0), _level(3.0, 80, 1 - 1 / 80), _level(8.0, 80, 0.9)]
    assert held_rate_rps([past]) == 3.0


def test_the_lightest_level_that_missed_caps_what_the_load_is_sized_from() -> None:
    missed = [_level(0.3, 1, 1.0), _level(1.0, 20, 0.8), _level(3.0, 15, 0.6)]
    assert held_rate_rps([missed]) is None
    assert lightest_failed_rps([missed]) == 1.0
    assert lightest_failed_rps([_replica(1.0)]) is None  # every level that counted held


def test_a_miss_that_a_heavier_level_does_not_repeat_is_passed_over() -> None:
    # More load cannot make a replica faster: 1 req/s missing while 3 and 5 held is the machine's noise.
    noisy = [_level(1.0, 20, 0.8), _level(3.0, 30, 1.0), _level(5.0, 50, 1.0), _level(8.0, 80, 0.9)]
    assert held_rate_rps([noisy]) == held_rate_rps([[_level(1.0, 20, 1.0), *noisy[1:]]])
    assert 5.0 < held_rate_rps([noisy]) < 8.0  # type: ignore[operator]
    assert lightest_failed_rps([noisy]) == 8.0
    # A miss at 3 after 1 held, with nothing heavier holding, still caps the rate where it did.
    capped = [_level(1.0, 20, 1.0), _level(3.0, 30, 0.8), _level(5.0, 50, 0.7)]
    assert 1.0 <= held_rate_rps([capped]) < 3.0  # type: ignore[operator]


def test_no_held_rate_when_the_first_level_that_counts_failed_or_none_counts() -> None:
    failing = [_level(0.3, 1, 1.0), _level(1.0, 6, 0.5), _level(3.0, 15, 0.5)]
    assert held_rate_rps([failing, failing]) is None
    assert held_rate_rps([[_level(0.3, 2, 1.0)], [_level(0.3, 2, 1.0)]]) is None
    assert held_rate_rps([[_level(1.0, 20, None)]]) is None


def test_a_level_whose_gaps_burn_the_itl_budget_is_not_held_though_its_requests_are() -> None:
    # Every request within (mean gap), but 2 % of the gaps over 20 ms at 3 req/s (four times the
    # 0.5 % a level may use): the controller's ITL SLI would burn there, so the held rate is carried
    # from 1 req/s, not from 3.
    def level(rate: float, gaps_within: float) -> dict[str, Any]:
        return {**_level(rate, 15, 1.0), "token_gaps": 300, "gaps_within_objective": gaps_within}

    replica = [level(1.0, 1.0), level(3.0, 0.98), level(8.0, 0.9)]
    assert held_rate_rps([replica, replica]) == pytest.approx(1.0 + 2.0 * 0.005 / 0.02)
    unmeasured = [_level(1.0, 15, 1.0), _level(3.0, 15, 1.0)]  # summaries without gap counts: requests decide
    assert held_rate_rps([unmeasured]) == 3.0


def _swept(rate: float, within: float, gaps_within: float) -> dict[str, Any]:
    return {"requests_per_s": rate, "requests": 40, "within_objectives": within, "token_gaps": 1000,
            "gaps_within_objective": gaps_within}


def test_moeslo_profile_writes_the_held_rate_as_the_profiles_ceiling() -> None:
    summaries = [_swept(1.0, 1.0, 1.0), _swept(2.0, 1.0, 0.998), _swept(4.0, 1.0, 0.98)]
    ceiled = with_held_ceiling(DEFAULT_PROFILE, summaries)
    # 2 req/s used 0.4 of the 0.5 % gap budget, 4 req/s four times it: the carry reaches it at 2 + 2 * 0.6 / 3.6.
    assert ceiled.max_request_rate_rps == pytest.approx(2.0 + 2.0 * 0.6 / 3.6)
    assert ceiled.itl_base_s == DEFAULT_PROFILE.itl_base_s  # the fit itself is left as it was
    missed = [_swept(1.0, 0.5, 0.9), _swept(2.0, 0.5, 0.9)]
    assert with_held_ceiling(DEFAULT_PROFILE, missed).max_request_rate_rps == DEFAULT_PROFILE.max_request_rate_rps


def test_levels_pool_by_the_rate_asked_for_when_a_replica_skipped_one() -> None:
    # One replica drew no arrival at 0.3 req/s and skipped it: its 1 req/s level must pool with the other's
    # 1 req/s level, not with its 0.3 one (by position, every later level mixed two rates).
    def level(rate: float, requests: int, within: float) -> dict[str, Any]:
        return {**_level(rate, requests, within), "rate_rps": rate}

    full = [level(0.3, 1, 1.0), level(1.0, 10, 1.0), level(2.0, 20, 1.0), level(3.0, 30, 0.5)]
    skipped = full[1:]
    assert held_rate_rps([full, skipped]) == held_rate_rps([full, full])
    assert held_rate_rps([full, skipped]) == pytest.approx(2.0 + 1.0 * 0.01 / 0.5)


def test_a_sweep_whose_every_level_held_writes_no_ceiling() -> None:
    """The top swept rate is a lower bound, not a limit: written as the ceiling, a replica the model says holds
    20 req/s was sized for 4 (100 req/s took 25 replicas where 5 do)."""
    summaries = [{**_swept(rate, 1.0, 1.0), "rate_rps": rate} for rate in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert held_rate_rps([summaries]) == 4.0  # ``moeslo up`` still sizes its load from it
    assert lightest_failed_rps([summaries]) is None
    assert with_held_ceiling(DEFAULT_PROFILE, summaries).max_request_rate_rps is None
