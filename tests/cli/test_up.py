"""``moeslo up`` refuses a trace it cannot replay before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize(
    ("content", "says"),
    [("", "file is empty"),
     ("Time,TIMESTAMP\n2024-05-13 00:00:00,378\n2024-05-13 00:00:10,412\n", "hours 4-16 from its start")],
    ids=["empty", "ends-before-the-window"],
)
def test_a_trace_that_cannot_be_replayed_is_refused_before_anything_starts(
    tmp_path: Path, content: str, says: str
) -> None:
    """The trace was read only when the load began: after the checkpoint, the profile, Prometheus, Alertmanager,
    the controller and the router had started (46 s into one run), and a count trace that ends before 04:00
    said only that it had no requests in [14400.0, 57600.0) s."""
    trace = tmp_path / "trace.csv"
    trace.write_text(content)
    result = CliRunner().invoke(app, ["up", "--trace", str(trace), "--out", str(tmp_path / "out"), "--no-live"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert says in output and str(trace) in output
    assert not (tmp_path / "out").exists()


def test_the_help_names_the_window_of_a_trace_that_is_replayed() -> None:
    shown = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "04:00-16:00" in " ".join(shown.output.split())


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize(("duration", "says"), [
    ("70", "the fault is cut short: --slowdown-at 62 s + --slowdown-for 28 s end past the 70 s of load"),
    ("62", "no fault in this run: --slowdown-at 62 s is not before the end of the 62 s of load"),
], ids=["ends-past-the-load", "starts-at-its-end"])
def test_a_fault_planned_past_the_load_is_said_before_anything_starts(
    tmp_path: Path, duration: str, says: str
) -> None:
    """The fault at 62 s for 28 s: with --duration 70 the load ends first and cuts it short; with --duration 62
    there is none (the run injects none: it began in the drain)."""
    result = CliRunner().invoke(app, ["up", "--duration", duration, "--out", str(tmp_path / "out"), "--no-live"],
                                env={"COLUMNS": "200"})
    output = " ".join(result.output.split())
    assert says in output
    assert ("cut short" in output) == (duration == "70")


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize(("args", "says"), [
    (["--speedup", "8"], "--speedup applies to a request trace only"),
    (["--trace", "REQUESTS", "--arrivals", "poisson"], "--arrivals applies to a count trace only"),
    (["--trace", "REQUESTS", "--base-load", "0.5"], "--base-load applies to a count trace only"),
], ids=["speedup-on-counts", "arrivals-on-requests", "base-load-on-requests"])
def test_options_the_trace_would_ignore_are_refused(tmp_path: Path, args: list[str], says: str) -> None:
    from harness.traces import BUNDLED_CONVERSATION_SLICE

    args = [str(BUNDLED_CONVERSATION_SLICE) if a == "REQUESTS" else a for a in args]
    result = CliRunner().invoke(app, ["up", *args, "--out", str(tmp_path / "out"), "--no-live"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_the_seed_reaches_the_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--seed sets the random checkpoint's, the load's and the profile's draws (it was fixed at 0)."""
    import stack

    seen: list[int] = []

    def run_stack(options: stack.StackOptions, *args: object, **kwargs: object) -> None:
        seen.append(options.seed)
        raise SystemExit(0)

    monkeypatch.setattr(stack, "run_stack", run_stack)
    CliRunner().invoke(app, ["up", "--seed", "7", "--out", str(tmp_path / "out"), "--no-live"])
    assert seen == [7]
