"""A run of the local stack starts from no state of the last one (pending verifications, pages sent)."""

from __future__ import annotations

from pathlib import Path

from stack.run import RUN_STATE, clear_last_run


def test_the_last_runs_state_is_removed_and_everything_else_kept(tmp_path: Path) -> None:
    (tmp_path / "controller.db").write_text("verifications pending")
    (tmp_path / "controller.db-wal").write_text("wal")
    (tmp_path / "alertmanager" / "data").mkdir(parents=True)
    (tmp_path / "alertmanager" / "data" / "nflog").write_text("pages sent")
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text("{}")
    assert clear_last_run(tmp_path)
    assert not any((tmp_path / name).exists() for name in RUN_STATE)
    assert (tmp_path / "checkpoint" / "config.json").exists() and (tmp_path / "summary.json").exists()
    assert not clear_last_run(tmp_path)  # nothing left to clear
