"""A relative --out or --checkpoint names the same files for every process the stack starts, whatever folder
``moeslo up`` was run from (its children run in the repository's root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stack.run import ROOT, LocalStack
from stack.services import Supervisor
from stack.state import StackOptions


class _Started(Exception):
    """Raised by the recording supervisor: nothing is started."""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Each process the stack would start, as (name, argv); the start stops right there."""
    calls: list[tuple[str, list[str]]] = []

    def record(self: Supervisor, name: str, argv: list[str], *args: Any, **kwargs: Any) -> None:
        calls.append((name, list(argv)))
        raise _Started

    monkeypatch.setattr(Supervisor, "start", record)
    return calls


def test_relative_out_and_checkpoint_name_the_same_files_for_the_stacks_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[tuple[str, list[str]]]
) -> None:
    """Run outside the repository's root, the replicas were started on ``ROOT/<out>/checkpoint`` (absent, or an
    older run's) and the controller on ``ROOT/<out>/controller.yaml``."""
    assert tmp_path != ROOT
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ck").mkdir()
    stack = LocalStack(StackOptions(out=Path("rel-out"), checkpoint=Path("ck"), prometheus=False))
    assert stack.options.out == tmp_path / "rel-out" and stack.options.checkpoint == tmp_path / "ck"
    try:
        with pytest.raises(_Started):
            stack.start(lambda _text: None)
        name, argv = started[-1]
        assert name == "profile-replica-0"
        assert argv[argv.index("--checkpoint") + 1] == str(tmp_path / "ck")
        stack.state.controller_url = "http://127.0.0.1:1"
        with pytest.raises(_Started):
            stack._start_controller(18099, 18100, stack.options.checkpoint or Path())
        name, argv = started[-1]
        config = Path(argv[argv.index("--config") + 1])
        assert name == "controller" and config == tmp_path / "rel-out" / "controller.yaml"
        assert yaml.safe_load(config.read_text())["local"]["checkpoint"] == str(tmp_path / "ck")
    finally:
        stack.stop()


def test_the_controller_is_told_where_the_stacks_prometheus_and_alertmanager_are(
    tmp_path: Path, started: list[tuple[str, list[str]]]
) -> None:
    """Without ``alertmanager_url`` the status page the run points to said Alertmanager was not configured,
    and listed no alert, while the stack's Alertmanager was delivering pages."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "out").mkdir()
    stack = LocalStack(StackOptions(out=tmp_path / "out", checkpoint=tmp_path / "ck"))
    try:
        stack.state.controller_url = "http://127.0.0.1:1"
        stack.state.prometheus_url, stack.state.alertmanager_url = "http://127.0.0.1:2", "http://127.0.0.1:3"
        with pytest.raises(_Started):
            stack._start_controller(18099, 18100, tmp_path / "ck")
        written = yaml.safe_load((tmp_path / "out" / "controller.yaml").read_text())
        assert written["prometheus_url"] == "http://127.0.0.1:2"
        assert written["alertmanager_url"] == "http://127.0.0.1:3"
    finally:
        stack.stop()
