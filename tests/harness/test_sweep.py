"""Poisson arrivals for the profile sweep."""

from __future__ import annotations

from harness.sweep import poisson_arrivals


def test_poisson_arrivals_rate() -> None:
    times = poisson_arrivals(50.0, 100.0, seed=1)
    assert 4500 < len(times) < 5500
    assert all(0 <= t < 100 for t in times)
