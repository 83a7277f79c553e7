"""A path option given as empty text is refused: typer reads ``""`` as the current folder, and the command wrote
its files there (or read the folder's, or took it for a checkpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize(
    "argv",
    [
        ["alerts", "generate", "--out", ""],
        ["dashboards", "generate", "--out", ""],
        ["dashboards", "push", "--url", "http://127.0.0.1:9", "--dir", ""],
        ["deploy", "render", "--dir", ""],
        ["deploy", "build", "base", "--dir", " "],
        ["up", "--out", ""],
        ["up", "--checkpoint", ""],
        ["replay", "--trace", "trace.csv", "--out", ""],
        ["rebalance", "--load", "load.json", "--ranks", "2", "--slots-per-rank", "2", "--out", ""],
        ["profile", "--url", "http://127.0.0.1:9", "--out", ""],
    ],
    ids=["alerts", "dashboards", "dashboards-push", "deploy-render", "deploy-build", "up-out", "up-checkpoint",
         "replay", "rebalance", "profile"],
)
def test_an_empty_path_is_refused_and_nothing_is_written_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "must not be empty" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []
