"""Policy settings: knob names and values a policy means something with, and the grids that use them."""

from __future__ import annotations

import pytest

from contracts.errors import ValidationError
from controller.replay.settings import SWEEP_GRIDS, Setting, parse_setting


def test_every_grid_setting_is_valid() -> None:
    assert sum(len(grid) for grid in SWEEP_GRIDS.values()) == len(
        [Setting.of(policy, knobs) for policy, grid in SWEEP_GRIDS.items() for knobs in grid]
    )


def test_values_at_the_edges_are_kept() -> None:
    assert parse_setting("hpa:target=1").number("target") == 1.0
    assert parse_setting("moeslo:cooldown_s=0,quantile=0.5").number("cooldown_s") == 0.0
    assert parse_setting("dynamo:predictor=kalman").text("predictor") == "kalman"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("hpa:target=-1", "hpa:target must be a number above 0 and at most 2"),
        ("hpa:target=abc", "hpa:target must be a number"),
        ("moeslo:quantile=2", "moeslo:quantile must be a number at least 0.5 and below 1"),
        ("moeslo:quantile=0.3", "moeslo:quantile must be a number at least 0.5 and below 1, got 0.3"),
        ("moeslo:quantile=nan", "moeslo:quantile must be a number at least 0.5 and below 1, got nan"),
        ("hpa:target=inf", "hpa:target must be a number above 0 and at most 2, got inf"),
        ("moeslo:cooldown_s=-5", "moeslo:cooldown_s must be a number at least 0"),
        ("static:headroom=0", "static:headroom must be a number above 0"),
        ("dynamo:predictor=magic", "dynamo:predictor must be one of constant, kalman, arima"),
        ("hpa:tagret=0.6", "hpa has no knob tagret"),
    ],
)
def test_values_a_policy_means_nothing_with_are_refused(text: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        parse_setting(text)
