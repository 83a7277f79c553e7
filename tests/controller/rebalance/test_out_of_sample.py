"""The out-of-sample scorer on cases worked out by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from controller.rebalance.out_of_sample import held_out_gain, leave_one_out, ordered_pairs, score_placement
from controller.rebalance.packing import FloatArray, IntArray


def test_score_of_a_placement_by_hand() -> None:
    # 2 ranks x 2 slots, experts 0..3 with load 4, 2, 1, 1: ranks carry 6 and 2, mean 4.
    score = score_placement([[0, 1, 2, 3]], [[4.0, 2.0, 1.0, 1.0]], 2)
    assert score.max_over_mean_avg == pytest.approx(1.5)
    assert score.cv_worst == pytest.approx(0.5)  # std of (6, 2) is 2
    # Expert 0 on both ranks: its 4 splits 2 + 2, ranks carry 2+2 and 2+2.
    even = score_placement([[0, 1, 0, 2]], [[4.0, 2.0, 2.0]], 2)
    assert even.max_over_mean_worst == pytest.approx(1.0) and even.cv_avg == pytest.approx(0.0)


def test_layers_without_load_do_not_count() -> None:
    score = score_placement([[0, 1, 2, 3], [0, 1, 2, 3]], [[0.0, 0, 0, 0], [3.0, 1, 1, 3]], 2)
    # Layer 1: ranks carry 4 and 4.
    assert score.max_over_mean_avg == pytest.approx(1.0) and score.max_over_mean_worst == pytest.approx(1.0)


def test_leave_one_out_plans_on_the_others_and_scores_the_one_left_out() -> None:
    windows = {"a": np.array([[4.0, 0, 0, 0]]), "b": np.array([[0.0, 4, 0, 0]]), "c": np.array([[0.0, 0, 4, 4]])}
    seen: list[list[float]] = []

    def planner(given: Sequence[FloatArray]) -> IntArray:
        seen.append([float(w.sum()) for w in given])
        return np.array([[0, 1, 2, 3]])  # ranks hold {0, 1} and {2, 3}

    scores = leave_one_out(windows, planner, 2)
    assert seen == [[4.0, 8.0], [4.0, 8.0], [4.0, 4.0]]  # b and c for a; a and c for b; a and b for c
    # a: all 4 on rank 0 -> max/mean 4/2 = 2, CV 1; b likewise; c: 0 + 8 on rank 1 -> 2.
    assert {name: s.max_over_mean_avg for name, s in scores.items()} == pytest.approx({"a": 2.0, "b": 2.0, "c": 2.0})
    assert scores["a"].cv_avg == pytest.approx(1.0)


def test_ordered_pairs_score_each_plan_on_every_other_window() -> None:
    windows = {"a": np.array([[3.0, 1, 1, 3]]), "b": np.array([[3.0, 3, 1, 1]])}

    def planner(given: Sequence[FloatArray]) -> IntArray:
        (load,) = given
        # Heaviest with lightest: on a (3, 1, 1, 3) ranks {0, 2} and {3, 1}; on b (3, 3, 1, 1) {0, 3} and {1, 2}.
        order = np.argsort(-load[0], kind="stable")
        return np.array([[order[0], order[3], order[1], order[2]]])

    pairs = ordered_pairs(windows, planner, 2)
    assert set(pairs) == {("a", "b"), ("b", "a")}
    # Planned on a, scored on b: ranks carry 3+1 = 4 and 1+3 = 4.
    assert pairs[("a", "b")].max_over_mean_worst == pytest.approx(1.0)
    # Planned on b, scored on a: ranks carry 3+3 = 6 and 1+1 = 2, mean 4.
    assert pairs[("b", "a")].max_over_mean_worst == pytest.approx(1.5)
    assert pairs[("b", "a")].cv_worst == pytest.approx(0.5)


def test_held_out_gain_takes_the_sampling_noise_out() -> None:
    window = np.array([[300.0, 100.0, 100.0, 300.0]])
    current = np.array([[0, 3, 1, 2]])  # ranks carry 600 and 200: CV 0.5
    planned = np.array([[0, 1, 2, 3]])  # 400 and 400: CV 0
    gain = held_out_gain(current, planned, window, 2)
    # Noise floor of 800 assignments on 2 ranks, shares (1/2, 1/2): sqrt(2 * (1 - 1/2) / 800) = 0.035.
    assert gain.noise_cv[0] == pytest.approx(np.sqrt(1 / 800))
    noise_before = np.sqrt(2 * (1 - (0.75**2 + 0.25**2)) / 800)
    assert gain.cv_before[0] == pytest.approx(np.sqrt(0.25 - noise_before**2))
    assert gain.cv_after[0] == 0.0
    assert gain.worst_before > gain.worst_after
    # The gain scatters with both placements' noise, which denoising does not take out.
    assert gain.noise_before[0] == pytest.approx(noise_before)
    assert gain.worst_spread == pytest.approx(np.sqrt(noise_before**2 + 1 / 800))
    assert gain.worst_noise == pytest.approx(max(noise_before, np.sqrt(1 / 800)))
