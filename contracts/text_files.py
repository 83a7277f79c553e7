"""Text files the user names (settings, policies, profiles, placements): read, or a one-line DataError naming them.

:func:`read_text` says which file could not be read or is not UTF-8 text (and on which line), where
``Path.read_text`` said only ``'utf-8' codec can't decode byte 0xe0 in position 0`` of no file.
:func:`yaml_error` makes PyYAML's several lines (the problem, its context, the marks, the line quoted
with a caret under it) the one line ``<file>:<line>: invalid YAML: <problem>``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from contracts.errors import DataError

if TYPE_CHECKING:
    import yaml


def read_text(path: str | os.PathLike[str], *, what: str = "") -> str:
    """The whole file as text (UTF-8; a byte-order mark dropped, as a spreadsheet or an editor may write one).

    ``what`` names the file in the message when it cannot be read (``cannot read profile: ...``).
    """
    try:
        with open(path, encoding="utf-8-sig") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise not_utf8_error(path, exc) from exc
    except OSError as exc:
        raise DataError(f"cannot read{' ' + what if what else ''}: {exc.strerror or exc}", path=str(path)) from exc


def not_utf8_error(path: str | os.PathLike[str], exc: UnicodeDecodeError) -> DataError:
    """The file and the line of the first byte that is not UTF-8 (``exc.object`` is what was decoded)."""
    before = exc.object[: exc.start]
    line = (before.count(b"\n") if isinstance(before, bytes) else 0) + 1
    byte = exc.object[exc.start : exc.start + 1]
    shown = f" (byte 0x{byte.hex()})" if isinstance(byte, bytes) and byte else ""
    return DataError(f"not a UTF-8 text file{shown}", path=str(path), line=line)


def yaml_error(exc: yaml.YAMLError, path: str | os.PathLike[str], text: str | None = None) -> DataError:
    """One line for what PyYAML refused: the file, the line, the problem (and what it was parsing).

    A marked error (the scanner's, the parser's) knows its line; a reader's (a control character) knows its
    position in ``text`` (the line is found when ``text`` is given) and says the rest on its first line.
    """
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = None if mark is None else int(mark.line) + 1
    position = getattr(exc, "position", None)
    if line is None and isinstance(position, int) and text is not None:
        line = text.count("\n", 0, position) + 1
    if not problem:
        message = context or (str(exc).splitlines() or ["unreadable"])[0]
    elif context:
        started = getattr(exc, "context_mark", None)
        since = f" from line {started.line + 1}" if started is not None and started.line + 1 != line else ""
        message = f"{problem} ({context}{since})"
    else:
        message = problem
    return DataError(f"invalid YAML: {message}", path=str(path), line=line)


__all__ = ["not_utf8_error", "read_text", "yaml_error"]
