"""The profile sweep: Poisson arrivals, and a stop that ends it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from harness import sweep
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


def _level(rate: float, requests: int, ok: int) -> dict[str, Any]:
    return {"requests": requests, "ok": ok, "status_counts": {"200": ok} if ok else {}, "output_tokens_per_s": 10.0,
            "ttft_p99_s": 0.1 if ok else None, "itl_p99_s": 0.01 if ok else None, "rate": rate}


def test_a_level_that_draws_no_arrival_is_skipped_not_the_end_of_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.3 req/s for 5 s draws no arrival one time in five: the sweep read that as 'no request succeeded' and
    stopped, so a replica's profile had no level at all."""
    drawn = {0.3: 0, 1.0: 5, 2.0: 10}
    monkeypatch.setattr(sweep, "measure_rate",
                        lambda _url, rate, **_kw: _level(rate, drawn[rate], drawn[rate]))  # fmt: skip
    lines: list[str] = []
    levels = sweep_rates("http://127.0.0.1:9", (0.3, 1.0, 2.0), duration_s=5.0, prompt_tokens=4, output_tokens=2,
                         vocab_size=100, model=None, seed=0, ttft_limit_s=1.0, progress=lines.append,
                         warmup_requests=0)  # fmt: skip
    assert [level["rate"] for level in levels] == [1.0, 2.0]
    assert lines[0] == "rate 0.3: no arrival drawn in 5 s (nothing sent); skipped"


def test_a_level_whose_requests_all_fail_ends_the_sweep() -> None:
    """Nothing listens on port 9: the first level that sent requests and saw none succeed is the last."""
    lines: list[str] = []
    levels = sweep_rates("http://127.0.0.1:9", (1e-9, 20.0, 40.0), duration_s=1.0, prompt_tokens=4, output_tokens=2,
                         vocab_size=100, model=None, seed=0, ttft_limit_s=1.0, progress=lines.append,
                         warmup_requests=0)  # fmt: skip
    assert levels == []
    assert "no arrival drawn" in lines[0] and "skipped" in lines[0]
    assert lines[1].startswith("rate 20: no request succeeded") and lines[1].endswith("stopping")
    assert len(lines) == 2


def test_a_level_of_one_token_outputs_reports_no_gap_p99_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-token outputs have no token gaps, so no ITL p99: the progress line raised on formatting None."""
    monkeypatch.setattr(sweep, "measure_rate", lambda _url, rate, **_kw: {**_level(rate, 3, 3), "itl_p99_s": None})
    lines: list[str] = []
    levels = sweep_rates("http://127.0.0.1:9", (1.0, 2.0), duration_s=5.0, prompt_tokens=4, output_tokens=1,
                         vocab_size=100, model=None, seed=0, ttft_limit_s=1.0, progress=lines.append,
                         warmup_requests=0)  # fmt: skip
    assert [level["rate"] for level in levels] == [1.0, 2.0]
    assert lines[0] == "rate 1 req/s: 10.0 output tok/s, TTFT p99 0.100 s, ITL p99 -"
