"""The per-request verdicts and the per-gap share the demo, the replay and the profile score with."""

from __future__ import annotations

import pytest

from contracts.attainment import every_gap_within, gaps_within_share, within_objectives


def test_a_request_is_within_on_its_mean_gap_and_strictly_within_only_if_every_gap_is() -> None:
    gaps = [0.010, 0.010, 0.035]  # mean 18.3 ms, one gap over 20 ms
    assert within_objectives(0.3, gaps)
    assert not every_gap_within(0.3, gaps)
    assert not within_objectives(0.6, [0.01])  # TTFT over 500 ms
    assert not within_objectives(None, [])  # no first token


def test_the_gap_share_counts_gaps_at_or_under_the_threshold() -> None:
    assert gaps_within_share([0.010, 0.020, 0.021, 0.050]) == pytest.approx(0.5)  # 20 ms itself is within
    assert gaps_within_share([0.03], itl_threshold_s=0.05) == 1.0
    assert gaps_within_share([]) is None
