"""``moeslo replay`` and ``moeslo forecast backtest`` refuse what means nothing with one ``error:`` line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from cli.main import app
from controller.forecast.backtest import BacktestResult
from controller.forecast.trace_backtest import horizon_report
from tests.controller.replay.test_cli import write_azure


def refused(result: Result) -> str:
    """The message of a refusal (exit 2, no traceback), on one line (out of typer's box, if in one)."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    return " ".join(result.output.replace("│", " ").split())


def test_tokens_per_s_on_a_part_without_requests_is_refused(tmp_path: Path) -> None:
    """A window past the trace's end has no tokens: the scaling divided by zero."""
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    args = ["replay", "--trace", str(trace), "--out", str(tmp_path / "o"), "--policies", "static", "--start", "9000",
            "--tokens-per-s", "100"]  # fmt: skip
    assert "error: --tokens-per-s: the part of the trace replayed has no tokens to scale" in refused(
        CliRunner().invoke(app, args)
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--duration", "60", "--warmup", "120"),
         "--duration (60 s) ends within --warmup (120 s), which is not scored"),
        (("--start", "9000", "--warmup", "0"), "the trace has no request from --start + --warmup (9000 s) to the "
                                                "trace's end"),
    ],
)
def test_an_empty_scored_window_names_its_cause(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    """It blamed the trace's end even where --duration, shorter than the warm-up, left nothing to score."""
    trace = write_azure(tmp_path / "t.csv", minutes=4)
    result = CliRunner().invoke(app, ["replay", "--trace", str(trace), "--out", str(tmp_path / "o"),
                                      "--policies", "static", *args])  # fmt: skip
    assert says in refused(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--prompt-tail", "nan"), "Invalid value for '--prompt-tail': must be a finite number of 1 or more and at "
                                   "most 100, got nan"),
        (("--prompt-tail", "1e300"), "'--prompt-tail': must be a finite number of 1 or more and at most 100"),
        (("--startup", "inf"), "Invalid value for '--startup': must be a finite number of 0 or more, got inf"),
        (("--warmup", "inf"), "Invalid value for '--warmup': must be a finite number of 0 or more, got inf"),
        (("--start", "inf"), "Invalid value for '--start': must be a finite number of 0 or more, got inf"),
        (("--tick", "inf"), "Invalid value for '--tick': must be above 0 and finite, got inf"),
        (("--scrape", "inf"), "Invalid value for '--scrape': must be above 0 and finite, got inf"),
        (("--tokens-per-s", "nan"), "Invalid value for '--tokens-per-s': must be above 0 and finite, got nan"),
        (("--policies", "moeslo:quantile=0.3"), "moeslo:quantile must be a number at least 0.5 and below 1, got 0.3"),
        (("--policies", "moeslo:headroom=1.2"), "moeslo:headroom must be a number at least 0.5 and at most 1, got 1.2"),
        (("--tokens-per-s", "-5"), "Invalid value for '--tokens-per-s': must be above 0 and finite, got -5.0"),
    ],
)
def test_replay_numbers_outside_their_range_are_refused_by_name(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    """Each ran on to nonsense (a NaN tail replayed as none) or a traceback (an infinite start-up in ticks)."""
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    result = CliRunner().invoke(app, ["replay", "--trace", str(trace), "--out", str(tmp_path / "o"), *args])
    assert says in refused(result)
    assert not (tmp_path / "o").exists()  # refused before any work


@pytest.mark.parametrize("horizon", ["inf", "nan", "-30"])
def test_forecast_horizon_must_be_finite_and_above_zero(tmp_path: Path, horizon: str) -> None:
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    result = CliRunner().invoke(app, ["forecast", "backtest", "--trace", str(trace), "--horizon", horizon])
    assert f"error: --horizon: {float(horizon)} s is not a finite number above 0" in refused(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--scale", "inf"), "Invalid value for '--scale': must be above 0 and finite"),
        (("--scale", "0"), "Invalid value for '--scale': must be above 0 and finite"),
        (("--seeds", "0"), "'--seeds'"),
        (("--workers", "0"), "'--workers'"),
    ],
)
def test_bench_replay_numbers_outside_their_range_are_refused(args: tuple[str, ...], says: str) -> None:
    assert says in refused(CliRunner().invoke(app, ["bench", "replay", *args]))


def strict_json(text: str) -> Any:
    """JSON as the standard has it: ``NaN`` and ``Infinity`` are not in it."""

    def refuse(word: str) -> Any:
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_forecast_backtest_json_says_null_where_wape_is_undefined(tmp_path: Path) -> None:
    """A test part without requests printed ``NaN`` scores and a ``NaN`` ratio: not JSON, and a best model."""
    stamps = [f"2024-05-12 00:{i // 6:02d}:{i % 6 * 10:02d}" for i in range(60)]
    counts = ["Time,TIMESTAMP"] + [f"{stamp},{5 if i < 30 else 0}" for i, stamp in enumerate(stamps)]
    trace = tmp_path / "c.csv"
    trace.write_text("\n".join(counts) + "\n")
    args = ["forecast", "backtest", "--trace", str(trace), "--bin", "10", "--horizon", "10", "--models",
            "last_value,holt_damped"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = strict_json(result.stdout)
    assert report["horizons"]["10s"] == {"horizon_s": 10.0, "wape": {"last_value": None, "holt_damped": None}}
    assert report["notes"] == ["the test part (last 50%) has no requests: WAPE is undefined (null)"]
    printed = " ".join(CliRunner().invoke(app, args).output.split())
    assert "last_value WAPE -" in printed and "best model" not in printed


def test_a_perfect_baseline_leaves_no_ratio() -> None:
    """The ratio divided by the baseline's WAPE of 0 (a constant series last value predicts exactly)."""
    def result(kind: str, score: float) -> BacktestResult:
        return BacktestResult(kind=kind, name=kind, horizons=(1,), wape_by_horizon={1: score}, residuals={},
                              predictions={}, origins=np.zeros(3))  # fmt: skip

    entry = horizon_report([result("last_value", 0.0), result("holt_damped", 0.1)], [1], 10.0)["10s"]
    assert entry["best_baseline"] == "last_value" and entry["best_model_vs_best_baseline"] is None



@pytest.mark.parametrize(("text", "says"), [("{not json", "cannot read a tuning sweep"),
                                            ('{"policies": {}}', "not a sweep.json")])  # fmt: skip
def test_tuned_from_is_read_before_the_sweep_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    """A file that is no sweep failed only after every run of the sweep (hours on a week's trace)."""

    def no_sweep(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep ran before --tuned-from was read")

    monkeypatch.setattr("controller.replay.protocol.run_sweep", no_sweep)
    trace, tuned = write_azure(tmp_path / "t.csv", minutes=2), tmp_path / "sweep.json"
    tuned.write_text(text)
    result = CliRunner().invoke(app, ["replay", "--sweep", "--trace", str(trace), "--policies", "static", "--out",
                                      str(tmp_path / "o"), "--tuned-from", str(tuned)])  # fmt: skip
    assert f"error: {tuned}: --tuned-from: {says}" in refused(result)
