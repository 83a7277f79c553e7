"""A count trace's shape as planned requests: the rate scaling and both arrival processes."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.traces import CountTrace, LengthDistribution
from harness.loadgen import plan_from_counts

LENGTHS = LengthDistribution.fixed(40, 8)


def _ramp(bins: int = 100) -> CountTrace:
    """Counts per 10 s rising linearly from 100 to 300 (a morning in miniature)."""
    return CountTrace(source="ramp", bin_s=10.0, counts=np.linspace(100.0, 300.0, bins))


def _counts_per_window(arrivals: list[float], duration_s: float, window_s: float) -> np.ndarray:
    return np.histogram(arrivals, bins=np.arange(0.0, duration_s + window_s / 2, window_s))[0]


def _expected_per_window(trace: CountTrace, base_rate_rps: float, duration_s: float, window_s: float) -> np.ndarray:
    rates = trace.counts / trace.counts[: len(trace.counts) // 10].mean() * base_rate_rps
    bin_s = duration_s / len(rates)
    cumulative = np.concatenate([[0.0], np.cumsum(rates * bin_s)])
    edges = np.arange(0.0, duration_s + window_s / 2, window_s)
    return np.diff(np.interp(edges, np.arange(len(rates) + 1) * bin_s, cumulative))


def test_even_arrivals_hold_every_window_to_its_expected_count() -> None:
    trace = _ramp()
    plan = plan_from_counts(trace, LENGTHS, start_s=0.0, span_s=trace.duration_s, duration_s=120.0,
                            base_rate_rps=2.0, arrivals="even")
    arrivals = [r.arrival_s for r in plan]
    assert arrivals == sorted(arrivals)
    got = _counts_per_window(arrivals, 120.0, 10.0)
    expected = _expected_per_window(trace, 2.0, 120.0, 10.0)
    assert np.all(np.abs(got - expected) < 2.0)
    assert got[-1] > got[0] * 2  # the ramp's shape: 100 -> 300 counts


def test_even_arrivals_draw_lengths_by_prompt_strata() -> None:
    trace = _ramp()
    lengths = LengthDistribution("ramp", np.arange(10, 410, 10, dtype=np.int64), np.full(40, 5, dtype=np.int64))
    plan = plan_from_counts(trace, lengths, start_s=0.0, span_s=trace.duration_s, duration_s=120.0,
                            base_rate_rps=2.0, arrivals="even", max_prompt_tokens=1000)
    blocks = np.array([r.prompt_tokens for r in plan][: len(plan) // 20 * 20]).reshape(-1, 20)
    # Each block of 20 holds one prompt from each of the 20 strata (10-20, 30-40, ..., 390-400).
    assert all(sorted((block - 10) // 20) == list(range(20)) for block in blocks)


def test_poisson_arrivals_keep_the_shape_with_counting_noise() -> None:
    trace = _ramp()
    plans = [plan_from_counts(trace, LENGTHS, start_s=0.0, span_s=trace.duration_s, duration_s=120.0,
                              base_rate_rps=2.0, seed=seed) for seed in range(20)]
    expected = _expected_per_window(trace, 2.0, 120.0, 10.0)
    deviations = np.concatenate([
        _counts_per_window([r.arrival_s for r in plan], 120.0, 10.0) - expected for plan in plans
    ])
    # Poisson counts: the spread is about sqrt(mean) (20-60 a window here), far beyond even arrivals' bound.
    assert np.abs(deviations).max() >= 5
    assert abs(float(deviations.mean())) < 1.5
    assert float(deviations.std()) == pytest.approx(float(np.sqrt(expected.mean())), rel=0.3)


def test_the_first_tenth_runs_at_the_base_rate_and_lengths_are_scaled() -> None:
    trace = _ramp()
    plan = plan_from_counts(trace, LENGTHS, start_s=0.0, span_s=trace.duration_s, duration_s=100.0,
                            base_rate_rps=3.0, arrivals="even", length_scale=0.5, max_output_tokens=3)
    first_tenth = [r for r in plan if r.arrival_s < 10.0]
    assert len(first_tenth) == pytest.approx(30, abs=2)
    assert {(r.prompt_tokens, r.max_tokens) for r in plan} == {(20, 3)}


def test_unknown_arrival_process_and_empty_window_are_refused() -> None:
    trace = _ramp()
    with pytest.raises(ValueError, match="arrivals must be"):
        plan_from_counts(trace, LENGTHS, start_s=0.0, span_s=100.0, duration_s=10.0, base_rate_rps=1.0,
                         arrivals="bursty")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no requests"):
        plan_from_counts(trace, LENGTHS, start_s=trace.duration_s + 10, span_s=100.0, duration_s=10.0,
                         base_rate_rps=1.0)
