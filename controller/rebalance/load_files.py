"""Expert-load files: an engine's expert-load JSON, or a ``.npy`` / ``.csv`` matrix.

The JSON is SGLang's expert distribution, ``{"logical_count": [[...], ...]}``,
layers x experts (a leading axis of passes or ranks is summed), or what our
engines serve, saved as it comes: the embedded engine's ``GET /v1/expert-load``
or the vLLM plugin's ``GET /moeslo/eplb``, whose ``expert_tokens`` is the
routing window (the last ``window_steps`` steps since the last placement swap:
the load the current placement serves).  Their ``expert_tokens_total`` (every
token since the engine started) is not read.  Whatever the format, the result is a
non-empty (layers, experts) matrix of finite, non-negative numbers, or a
:class:`~contracts.errors.DataError` that names the file (and line) and every problem.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.errors import DataError
from contracts.text_files import read_text

FloatArray = npt.NDArray[np.float64]

_JSON_KEYS = ("logical_count", "expert_tokens")
_JSON_FORMS = ('an object with "logical_count" (SGLang\'s expert distribution) or "expert_tokens" (saved from '
               "GET /v1/expert-load of moeslo serve, or GET /moeslo/eplb of vLLM with the moeslo plugin): "
               "[[count per expert] per layer]")


def read_expert_load(path: str | Path) -> FloatArray:
    """(layers, experts) load from a JSON, .npy or .csv file; DataError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise DataError("a folder, not a load file" if path.is_dir() else "no such file", path=str(path))
    suffix = path.suffix.lower()
    if suffix == ".json":
        matrix = _read_json(path)
    elif suffix == ".npy":
        try:
            raw = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"not a readable .npy array: {exc}", path=str(path)) from exc
        if not np.issubdtype(raw.dtype, np.number) or np.issubdtype(raw.dtype, np.complexfloating):
            raise DataError(f"array must hold real numbers, got dtype {raw.dtype}", path=str(path))
        matrix = raw.astype(np.float64)
    elif suffix == ".csv":
        matrix = _read_csv(path)
    else:
        raise DataError(f"unknown load file type {suffix or '(none)'!r}: use .json, .npy or .csv", path=str(path))
    return _check_matrix(matrix, str(path))


def _read_json(path: Path) -> FloatArray:
    text = read_text(path, what="load file")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg}", path=str(path), line=exc.lineno) from exc
    key = next((k for k in _JSON_KEYS if isinstance(raw, dict) and k in raw), None)
    if key is None:
        raise DataError(f"expected {_JSON_FORMS}", path=str(path))
    if key == "expert_tokens" and raw[key] is None:
        raise DataError('"expert_tokens" is null: the engine counts no routed tokens (vLLM: MOESLO_VLLM_PLUGIN=1 '
                        "and VLLM_PLUGINS naming moeslo)", path=str(path))
    wrong = _non_numbers(raw[key])
    if wrong:
        index, value = wrong[0]
        names = ("pass", "layer", "expert")[-len(index):] if 1 < len(index) <= 3 else ()
        where = ", ".join(f"{n} {i}" for n, i in zip(names, index, strict=True)) or f"index {list(index)}"
        what = "entry that is not a number" if len(wrong) == 1 else "entries that are not numbers"
        raise DataError(f'"{key}" holds {len(wrong)} {what} (first: {where}: {json.dumps(value)})', path=str(path))
    try:
        matrix = np.asarray(raw[key], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f'"{key}" must be a rectangular matrix of numbers (layers x experts): {exc}', path=str(path)
        ) from exc
    if key == "logical_count" and matrix.ndim == 3:
        matrix = matrix.sum(axis=0)  # per-pass or per-rank records: total over them
    if key == "expert_tokens" and matrix.size and not matrix.any():
        raise DataError(f"the engine's window holds no routed tokens yet (steps_in_window "
                        f"{raw.get('steps_in_window', 0)}): save it again after it has served traffic",
                        path=str(path))
    return matrix


def _non_numbers(value: Any, at: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Any]]:
    """(index, entry) of every entry of nested lists that is no JSON number: null, a string, a boolean (numpy
    would read "1" and true as 1.0, and null as NaN)."""
    if not isinstance(value, list):
        return [] if type(value) in (int, float) else [(at, value)]
    if all(type(item) in (int, float) for item in value):  # a row of numbers, the common case, at C speed
        return []
    return [found for i, item in enumerate(value) for found in _non_numbers(item, (*at, i))]


def _read_csv(path: Path) -> FloatArray:
    rows: list[list[float]] = []
    header_skipped = False
    lines = read_text(path, what="load file").splitlines()  # a spreadsheet's byte-order mark dropped too
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            row = [float(cell) for cell in text.split(",")]
        except ValueError as exc:
            if not rows and not header_skipped and _is_header(text):
                header_skipped = True  # the first non-comment line may name the columns
                continue
            raise DataError(f"not a number: {exc}", path=str(path), line=number) from exc
        if not rows and not header_skipped and _is_index_header(row):
            header_skipped = True  # the column numbers pandas' to_csv writes: a layer of data would shift them all
            continue
        if rows and len(row) != len(rows[0]):
            raise DataError(f"{len(row)} columns, earlier rows have {len(rows[0])}", path=str(path), line=number)
        rows.append(row)
    return np.asarray(rows, dtype=np.float64)


INDEX_HEADER_MIN_COLUMNS = 4
"""Fewest columns a first row of 0, 1, 2, ... needs to be read as column numbers (a header), not a layer."""


def _is_index_header(row: list[float]) -> bool:
    """A first row that numbers the columns 0, 1, 2, ...: the header ``pandas.DataFrame(load).to_csv(index=False)``
    writes.  A layer routing exactly 0, 1, 2, ... tokens to its experts is not a load anyone records."""
    return len(row) >= INDEX_HEADER_MIN_COLUMNS and row == [float(i) for i in range(len(row))]


def _is_header(text: str) -> bool:
    """A line naming columns: no cell of it is a number (a data row with a typo has some that are)."""
    for cell in text.split(","):
        try:
            float(cell)
        except ValueError:
            continue
        return False
    return True


def _check_matrix(matrix: FloatArray, where: str) -> FloatArray:
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise DataError(f"load must be a non-empty layers x experts matrix, got shape {matrix.shape}", path=where)
    problems: list[str] = []
    bad = ~np.isfinite(matrix)
    if bad.any():
        layer, expert = np.argwhere(bad)[0]
        problems.append(f"{int(bad.sum())} entries are NaN or infinite (first: layer {layer}, expert {expert})")
    negative = np.isfinite(matrix) & (matrix < 0)
    if negative.any():
        layer, expert = np.argwhere(negative)[0]
        problems.append(f"{int(negative.sum())} entries are negative (first: layer {layer}, expert {expert})")
    if problems:
        raise DataError("; ".join(problems), path=where)
    return matrix


def read_expert_loads(paths: Sequence[str | Path]) -> list[FloatArray]:
    """Several windows of one model's load: every file read, and all the same shape.

    A file whose layers or experts differ from the first file's is a DataError
    that names both files.
    """
    if not paths:
        raise DataError("no expert-load file given")
    matrices = [read_expert_load(path) for path in paths]
    first, shape = paths[0], matrices[0].shape
    for path, matrix in zip(paths[1:], matrices[1:], strict=True):
        if matrix.shape != shape:
            raise DataError(
                f"{matrix.shape[0]} layers x {matrix.shape[1]} experts, but {first} has {shape[0]} layers x "
                f"{shape[1]} experts: every load file must describe the same model",
                path=str(path),
            )
    return matrices


__all__ = ["read_expert_load", "read_expert_loads"]
