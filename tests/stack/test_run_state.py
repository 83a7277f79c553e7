"""A run of the local stack starts from no state of the last one (pending verifications, pages sent),
and owns its folder while it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contracts.errors import ConflictError
from stack.run_folder import RUN_MARKER, RUN_STATE, clear_last_run, lock_run_folder


def test_the_last_runs_state_is_removed_and_everything_else_kept(tmp_path: Path) -> None:
    (tmp_path / RUN_MARKER).write_text("a run was here")
    (tmp_path / "controller.db").write_text("verifications pending")
    (tmp_path / "controller.db-wal").write_text("wal")
    (tmp_path / "alertmanager" / "data").mkdir(parents=True)
    (tmp_path / "alertmanager" / "data" / "nflog").write_text("pages sent")
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "controller.log").write_text("the last run's")
    (tmp_path / "notes.txt").write_text("the user's")
    assert clear_last_run(tmp_path)
    assert not any((tmp_path / name).exists() for name in RUN_STATE)
    # A run that fails or is interrupted must not leave the last run's results looking like its own.
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "logs").exists()
    assert (tmp_path / "checkpoint" / "config.json").exists() and (tmp_path / "notes.txt").exists()
    assert not clear_last_run(tmp_path)  # nothing left to clear


def test_a_folder_no_run_made_loses_nothing(tmp_path: Path) -> None:
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "prometheus" / "prometheus").write_text("someone's binary")
    (tmp_path / "controller.db").write_text("someone's database")
    assert not clear_last_run(tmp_path)
    assert (tmp_path / "prometheus" / "prometheus").exists() and (tmp_path / "controller.db").exists()


def test_a_link_is_removed_and_what_it_points_to_kept(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("not the run's")
    out = tmp_path / "out"
    out.mkdir()
    (out / RUN_MARKER).write_text("a run was here")
    (out / "prometheus").symlink_to(elsewhere, target_is_directory=True)
    assert clear_last_run(out)
    assert not (out / "prometheus").exists() and (elsewhere / "keep").exists()


def test_a_second_run_in_a_folder_in_use_is_refused_until_the_first_ends(tmp_path: Path) -> None:
    first = lock_run_folder(tmp_path)
    try:
        with pytest.raises(ConflictError, match=rf"pid {os.getpid()}.*another --out"):
            lock_run_folder(tmp_path)
    finally:
        os.close(first)
    os.close(lock_run_folder(tmp_path))  # the first run ended: the folder is free again


def test_an_interrupted_run_keeps_what_it_saw_marked_as_interrupted(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the load: every process is stopped, and the summary of the run so far is written."""
    from stack import StackOptions, run_stack
    from stack.run import LocalStack

    stopped: list[bool] = []

    async def interrupted_load(self: LocalStack) -> None:
        self.state.event("load under way")
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "start", lambda self, progress: None)
    monkeypatch.setattr(LocalStack, "run_load", interrupted_load)
    monkeypatch.setattr(LocalStack, "stop", lambda self: stopped.append(True))
    with pytest.raises(KeyboardInterrupt):
        run_stack(StackOptions(out=tmp_path, prometheus=False))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert stopped and summary["interrupted"] is True and any("load under way" in e for e in summary["events"])


def test_a_run_interrupted_before_its_load_writes_no_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stack import StackOptions, run_stack
    from stack.run import LocalStack

    def interrupted_start(self: LocalStack, progress: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "start", interrupted_start)
    monkeypatch.setattr(LocalStack, "stop", lambda self: None)
    with pytest.raises(KeyboardInterrupt):
        run_stack(StackOptions(out=tmp_path, prometheus=False))
    assert not (tmp_path / "summary.json").exists()
