"""Writing generated texts to disk (the one I/O step of the generators)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_text_files(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write relative path -> text under ``out``; a file whose text is unchanged is left alone."""
    written: list[Path] = []
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


__all__ = ["write_text_files"]
