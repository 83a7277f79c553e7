"""``moeslo replay`` and ``moeslo forecast backtest`` refuse what means nothing with one ``error:`` line."""

from __future__ import annotations

from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from cli.main import app
from tests.controller.replay.test_cli import write_azure


def refused(result: Result) -> str:
    """The message of a refusal (exit 2, no traceback), on one line."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    return " ".join(result.output.split())


def test_tokens_per_s_on_a_part_without_requests_is_refused(tmp_path: Path) -> None:
    """A window past the trace's end has no tokens: the scaling divided by zero."""
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    args = ["replay", "--trace", str(trace), "--out", str(tmp_path / "o"), "--policies", "static", "--start", "9000",
            "--tokens-per-s", "100"]  # fmt: skip
    assert "error: --tokens-per-s: the part of the trace replayed has no tokens to scale" in refused(
        CliRunner().invoke(app, args)
    )
