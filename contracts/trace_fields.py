"""The fields of trace files: CSV rows, columns, token counts, times; each error names the file and line."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from contracts.errors import DataError

__all__ = ["MAX_TOKENS", "cell", "column_index", "csv_rows", "epoch_s", "seconds", "tokens"]

MAX_TOKENS = 1_000_000_000
"""The most tokens one request (or requests one bin) may count: far beyond any model's context, and far
below what overflows the 64-bit integers the replay sums them in."""
UTC_OFFSET = re.compile(r"([+-])([0-9]{2}):?([0-9]{2})$")


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) for each non-blank line of a CSV file."""
    with path.open("r", encoding="utf-8-sig", newline="") as handle:  # a byte-order mark is not a column name
        reader = csv.reader(handle)
        for fields in reader:
            if fields and any(f.strip() for f in fields):
                yield reader.line_num, fields


def column_index(path: Path, header: Sequence[str], needed: Sequence[str]) -> list[int]:
    names = [h.strip() for h in header]
    missing = [c for c in needed if c not in names]
    if missing:
        raise DataError(
            f"missing column(s) {', '.join(missing)}; header has {', '.join(names)}", path=str(path), line=1
        )
    return [names.index(c) for c in needed]


def cell(path: Path, line: int, fields: Sequence[str], index: int, column: str) -> str:
    if index >= len(fields):
        raise DataError(f"row has {len(fields)} fields, missing column {column!r}", path=str(path), line=line)
    return fields[index].strip()


def tokens(path: Path, line: int, text: str, column: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{column} {text!r} is not a number", path=str(path), line=line) from None
    if not 0 <= value <= MAX_TOKENS or value != int(value):
        raise DataError(f"{column} {text!r} must be an integer from 0 to {MAX_TOKENS:,}", path=str(path), line=line)
    return int(value)


def epoch_s(path: Path, line: int, text: str) -> float:
    """Seconds since the epoch, in UTC: a ``+05:30`` or ``-07:00`` suffix is the stamp's offset from it."""
    offset = UTC_OFFSET.search(text)
    local = text[: offset.start()] if offset else text.removesuffix("Z")
    try:
        stamp = np.datetime64(local.strip().replace(" ", "T"), "ns")
    except ValueError:
        raise DataError(f"timestamp {text!r} is not a date-time", path=str(path), line=line) from None
    if np.isnat(stamp):  # numpy reads "" and "NaT" as not-a-time, whose integer is the year 1677
        raise DataError(f"timestamp {text!r} is not a date-time", path=str(path), line=line)
    shift_s = 0.0
    if offset:
        sign = -1.0 if offset.group(1) == "-" else 1.0
        shift_s = sign * (int(offset.group(2)) * 3600 + int(offset.group(3)) * 60)
    return float(stamp.astype(np.int64)) / 1e9 - shift_s


def seconds(path: Path, line: int, text: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{column} {text!r} is not a number", path=str(path), line=line) from None
    if value < 0 or not np.isfinite(value):
        raise DataError(f"{column} {text!r} must be a non-negative time", path=str(path), line=line)
    return value
