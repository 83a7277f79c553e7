"""Writing generated texts to disk (the one I/O step of the generators), all files or none.

Every target is checked before anything is written; the changed files are then written under
temporary names beside their targets and renamed into place only once all of them are written.
A failure (a directory where a file goes, a full disk, no permission) leaves the old files as they
were, removes the temporary files and the folders it made, and names the path in its error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from contracts.errors import DataError


def write_text_files(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write relative path -> text under ``out``; a file whose text is unchanged is left alone."""
    targets = [out / name for name in files]
    changed = {path: text for path, text in zip(targets, files.values(), strict=True) if _differs(path, text)}
    made: list[Path] = []
    staged: dict[Path, Path] = {}
    for path, text in changed.items():
        try:
            _make_folders(path.parent, made)
            staged[path] = _write_beside(path, text)
        except OSError as exc:
            _undo(staged.values(), made)
            raise DataError(f"cannot write: {exc.strerror or exc} (nothing written)", path=str(path)) from exc
    for number, (path, temporary) in enumerate(staged.items()):
        try:
            temporary.replace(path)
        except OSError as exc:
            _undo(list(staged.values())[number:], [])
            raise DataError(f"cannot replace: {exc.strerror or exc} ({number} of {len(staged)} files replaced)",
                            path=str(path)) from exc
    return targets


def _differs(path: Path, text: str) -> bool:
    """Whether ``path`` must be (re)written; DataError when a directory stands where it goes, or a file where
    a folder of it goes."""
    if path.is_dir():
        raise DataError("is a directory, where a generated file goes (nothing written)", path=str(path))
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if folder.exists() and not folder.is_dir():
        raise DataError("is not a directory, where generated files go (nothing written)", path=str(folder))
    if not path.exists():
        return True
    try:
        return path.read_text(encoding="utf-8") != text
    except UnicodeDecodeError:
        return True


def _make_folders(folder: Path, made: list[Path]) -> None:
    """Create ``folder`` and its missing parents, adding each to ``made`` as it is created."""
    for parent in reversed([parent for parent in (folder, *folder.parents) if not parent.exists()]):
        parent.mkdir()
        made.append(parent)


def _write_beside(path: Path, text: str) -> Path:
    """``text`` in a new temporary file in ``path``'s folder, with ``path``'s permissions if it exists."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        if path.exists():
            os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def _undo(temporaries: Iterable[Path], made: list[Path]) -> None:
    """Remove the temporary files and the folders made for them (the deepest first, if empty)."""
    for temporary in temporaries:
        temporary.unlink(missing_ok=True)
    for folder in reversed(made):
        with contextlib.suppress(OSError):  # something else was put there meanwhile
            folder.rmdir()


__all__ = ["write_text_files"]
