"""The generators write all their files or none: a failure leaves the old files as they were, no temporary
file behind, and names the path in one ``error:`` line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from contracts.errors import DataError
from generators.manifests.files import write_text_files

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


@pytest.fixture(autouse=True)
def _without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_DEBUG", raising=False)


def _tree(root: Path) -> dict[str, str | None]:
    """Every path below ``root``: a file's text, None for a folder, ``-> target`` for a link."""
    return {str(path.relative_to(root)): f"-> {os.readlink(path)}" if path.is_symlink()
            else None if path.is_dir() else path.read_text() for path in sorted(root.rglob("*"))}


def _run(*args: str) -> tuple[int, list[str]]:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.splitlines()


@pytest.mark.parametrize(("command", "blocked"), [("dashboards", "moeslo-controller.json"),
                                                  ("alerts", "alertmanager.yaml")])
def test_generate_writes_nothing_when_one_target_is_a_directory(tmp_path: Path, command: str,
                                                                blocked: str) -> None:
    out = tmp_path / "out"
    (out / blocked).mkdir(parents=True)
    (out / "old.txt").write_text("kept")
    before = _tree(out)
    code, lines = _run(command, "generate", "--out", str(out))
    assert (code, lines) == (2, [f"error: {out / blocked}: is a directory, where a generated file goes "
                                 "(nothing written)"])
    assert _tree(out) == before


def _deploy_copy(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A copy of deploy/ and its generated files, by path."""
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    return deploy, sorted(deploy.glob("**/generated/*.yaml"))


def test_deploy_render_leaves_the_generated_tree_as_it_was(tmp_path: Path) -> None:
    deploy, generated = _deploy_copy(tmp_path)
    for path in generated:
        path.write_text("stale\n")  # what render would rewrite, had it gone on
    generated[-1].unlink()
    generated[-1].mkdir()
    before = _tree(deploy)
    code, lines = _run("deploy", "render", "--dir", str(deploy))
    assert (code, lines) == (2, [f"error: {generated[-1]}: is a directory, where a generated file goes "
                                 "(nothing written)"])
    assert _tree(deploy) == before


def test_deploy_render_still_writes_the_committed_tree(tmp_path: Path) -> None:
    deploy, generated = _deploy_copy(tmp_path)
    for path in generated:
        path.unlink()
    code, lines = _run("deploy", "render", "--dir", str(deploy))
    assert code == 0, lines
    assert _tree(deploy) == _tree(DEPLOY)


def test_a_failed_write_removes_what_it_wrote_and_made(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("old")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # no folder can be made there
    before = _tree(tmp_path)
    files = {"a.json": "new", "made/b.json": "new", "dangling/c.json": "new"}
    with pytest.raises(DataError, match=r"dangling/c\.json: cannot write: File exists \(nothing written\)"):
        write_text_files(tmp_path, files)
    assert _tree(tmp_path) == before


def test_a_failed_rename_says_how_many_were_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replace = Path.replace

    def replace_once(self: Path, target: str | os.PathLike[str]) -> Path:
        if Path(target).name == "b.json":
            raise OSError(5, "Input/output error")
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", replace_once)
    with pytest.raises(DataError, match=r"b\.json: cannot replace: Input/output error \(1 of 2 files replaced\)"):
        write_text_files(tmp_path, {"a.json": "new", "b.json": "new"})
    assert _tree(tmp_path) == {"a.json": "new"}


def test_unchanged_files_are_left_alone_and_changed_ones_keep_their_mode(tmp_path: Path) -> None:
    same, changed = tmp_path / "same.json", tmp_path / "changed.json"
    same.write_text("same")
    changed.write_text("old")
    changed.chmod(0o640)
    inode = same.stat().st_ino
    written = write_text_files(tmp_path, {"same.json": "same", "changed.json": "new", "sub/new.json": "new"})
    assert written == [same, changed, tmp_path / "sub" / "new.json"]
    assert same.stat().st_ino == inode
    assert changed.read_text() == "new" and changed.stat().st_mode & 0o777 == 0o640
    assert _tree(tmp_path) == {"changed.json": "new", "same.json": "same", "sub": None, "sub/new.json": "new"}


def test_a_file_where_a_folder_goes_is_refused_first(tmp_path: Path) -> None:
    (tmp_path / "sub").write_text("a file")
    with pytest.raises(DataError, match=r"sub: is not a directory, where generated files go"):
        write_text_files(tmp_path, {"a.json": "new", "sub/deeper/b.json": "new"})
    assert _tree(tmp_path) == {"sub": "a file"}
