"""What ``moeslo up`` replays: a count trace's window by its clock; options a trace would ignore are refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts.errors import ValidationError
from harness.traces import BUNDLED_CONVERSATION_SLICE
from stack.load import check_trace, load_plan
from stack.state import StackOptions


def test_speedup_on_a_count_trace_is_refused() -> None:
    """--speedup 8 on the bundled count trace (the default) planned the very same load as --speedup 1."""
    with pytest.raises(ValidationError, match=r"--speedup applies to a request trace only.*leave it out"):
        check_trace(StackOptions(speedup=8.0), given={"speedup"})
    check_trace(StackOptions(speedup=8.0))  # not given: nothing to say


@pytest.mark.parametrize(("given", "named"), [({"arrivals"}, "--arrivals"), ({"base_load"}, "--base-load"),
                                              ({"arrivals", "base_load"}, "--arrivals and --base-load")])
def test_arrivals_and_base_load_on_a_request_trace_are_refused(given: set[str], named: str) -> None:
    """A request trace is replayed as its requests came: --arrivals and --base-load changed nothing."""
    options = StackOptions(trace=BUNDLED_CONVERSATION_SLICE, arrivals="poisson", base_load=0.2, speedup=2.0)
    with pytest.raises(ValidationError, match=f"{named} appl(y|ies) to a count trace only"):
        check_trace(options, given={*given, "speedup"})
    check_trace(options, given={"speedup"})


def _counts_from(tmp_path: Path, first_hour: int, hours: int, step_at_h: int, first_second: int = 0) -> Path:
    """A count trace from ``first_hour`` UTC, 60 per 10 s, 120 from ``step_at_h`` o'clock on."""
    start = datetime(2024, 5, 13, first_hour, 0, first_second, tzinfo=UTC)
    rows = [(start + timedelta(seconds=10 * i)) for i in range(hours * 360)]
    path = tmp_path / "counts.csv"
    path.write_text("Time,TIMESTAMP\n" + "".join(
        f"{t:%Y-%m-%d %H:%M:%S},{120 if (t - start).total_seconds() >= (step_at_h - first_hour) * 3600 else 60}\n"
        for t in rows))
    return path


def test_a_count_trace_is_replayed_from_its_clocks_0400_and_named_so(tmp_path: Path) -> None:
    """A trace starting at 02:00 was replayed from 06:00 (four hours in) and called 04:00-16:00."""
    options = StackOptions(trace=_counts_from(tmp_path, first_hour=2, hours=20, step_at_h=10), duration_s=120.0,
                           arrivals="even")
    plan, what = load_plan(options, 1.0)
    assert "04:00-16:00 UTC compressed into 120 s" in what
    # 04:00-10:00 at 60, then 120: the rise comes halfway through the 120 s, not a third of the way.
    first, second = sum(r.arrival_s < 60.0 for r in plan), sum(r.arrival_s >= 60.0 for r in plan)
    assert first == pytest.approx(60, abs=2) and second == pytest.approx(120, abs=2)


def test_a_count_trace_that_does_not_hold_the_clock_window_is_replayed_by_hours_from_its_start(tmp_path: Path) -> None:
    options = StackOptions(trace=_counts_from(tmp_path, first_hour=6, hours=16, step_at_h=12), duration_s=120.0,
                           arrivals="even")
    _, what = load_plan(options, 1.0)
    assert "hours 4-16 from its start compressed into 120 s" in what


def test_a_count_trace_whose_first_bin_holds_0400_is_replayed_from_it(tmp_path: Path) -> None:
    """Starting at 04:00:05, it did not hold 04:00-16:00 "whole" and was replayed from 08:00:05."""
    trace = _counts_from(tmp_path, first_hour=4, hours=13, step_at_h=10, first_second=5)
    plan, what = load_plan(StackOptions(trace=trace, duration_s=120.0, arrivals="even"), 1.0)
    assert "04:00-16:00 UTC compressed into 120 s" in what
    assert sum(r.arrival_s < 60.0 for r in plan) == pytest.approx(60, abs=2)
