"""``python -m cli.main`` and the ``moeslo`` entry point build the same app, with every command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("bench", "alerts", "controller", "policy", "dashboards", "deploy", "forecast", "model")
COMMANDS = ("profile", "rebalance", "replay", "route", "serve", "up")


def _paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    if hasattr(command, "list_commands"):
        ctx = command.context_class(command)
        for name in command.list_commands(ctx):
            found.extend(_paths(command.get_command(ctx, name), (*path, name)))
    return found


def test_every_command_and_group_is_registered() -> None:
    top = get_command(app)
    names = top.list_commands(top.context_class(top))
    assert sorted(names) == sorted((*GROUPS, *COMMANDS))


@pytest.mark.parametrize("path", _paths(get_command(app)), ids=lambda p: " ".join(p) or "moeslo")
def test_help_of_every_command(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize("argv", [["--help"], ["forecast", "--help"], ["bench", "replay", "--help"]])
def test_python_dash_m_cli_main(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


def test_the_moeslo_entry_point() -> None:
    result = subprocess.run([str(Path(sys.executable).parent / "moeslo"), "forecast", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "backtest" in result.stdout


def test_serve_passes_slots_per_rank_to_the_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import exporters.app

    seen: list[exporters.app.ServeOptions] = []

    class Stop(Exception):
        pass

    def build_stack(options: exporters.app.ServeOptions) -> None:
        seen.append(options)
        raise Stop

    monkeypatch.setattr(exporters.app, "build_stack", build_stack)
    result = CliRunner().invoke(app, ["serve", "--checkpoint", str(tmp_path), "--ep", "2", "--slots-per-rank", "6"])
    assert isinstance(result.exception, Stop), result.output
    assert seen[0].ep == 2 and seen[0].slots_per_rank == 6
    result = CliRunner().invoke(app, ["serve", "--checkpoint", str(tmp_path)])
    assert seen[1].slots_per_rank is None


def test_serve_passes_the_core_silence_timeout_to_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import exporters.app
    from engine.engine_types import EngineConfig

    seen: list[EngineConfig] = []

    class Stop(Exception):
        pass

    def engine_client(_executor: object, config: EngineConfig) -> None:
        seen.append(config)
        raise Stop

    monkeypatch.setattr(exporters.app, "EngineCoreClient", engine_client)
    monkeypatch.setattr(exporters.app, "sampling_defaults", lambda _path: None)
    result = CliRunner().invoke(app, ["serve", "--checkpoint", str(tmp_path), "--core-silence-timeout-s", "2.5"])
    assert isinstance(result.exception, Stop), result.output
    assert seen[0].core_silence_timeout_s == 2.5
