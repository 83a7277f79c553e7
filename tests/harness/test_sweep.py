"""The profile sweep: Poisson arrivals, and a stop that ends it."""

from __future__ import annotations

import threading
import time

from harness.sweep import poisson_arrivals, sweep_rates


def test_poisson_arrivals_rate() -> None:
    times = poisson_arrivals(50.0, 100.0, seed=1)
    assert 4500 < len(times) < 5500
    assert all(0 <= t < 100 for t in times)


def test_a_stopped_sweep_measures_nothing_more() -> None:
    """Ctrl-C in ``moeslo up``'s profile: the sweeps end before their next level (port 9 would refuse)."""
    stop = threading.Event()
    stop.set()
    began = time.monotonic()
    levels = sweep_rates("http://127.0.0.1:9", (1.0, 2.0), duration_s=30.0, prompt_tokens=4, output_tokens=2,
                         vocab_size=100, model=None, seed=0, ttft_limit_s=1.0, stop=stop)  # fmt: skip
    assert levels == [] and time.monotonic() - began < 1.0
