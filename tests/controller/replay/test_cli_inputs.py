"""``moeslo replay`` and ``moeslo forecast backtest`` refuse what means nothing with one ``error:`` line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cli.main import app
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
