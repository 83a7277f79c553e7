"""``moeslo rebalance``: plan an expert placement from an expert-load file; ``moeslo bench rebalance``.

The load file is SGLang's expert-distribution JSON (``{"logical_count":
[[...], ...]}``, layers x experts; a leading axis of passes or ranks is
summed), or a ``.npy`` / ``.csv`` matrix.  The output JSON loads with
``Placement.from_json`` and adds moves, imbalance before and after, and the
planning time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
import typer

from cli.common import bench_app, cli_errors, console, print_json
from cli.main import app
from contracts.errors import DataError

FloatArray = npt.NDArray[np.float64]


def read_expert_load(path: str | Path) -> FloatArray:
    """(layers, experts) load from a JSON, .npy or .csv file; DataError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise DataError("no such file", path=str(path))
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
    try:
        raw = json.loads(path.read_text())
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc}", path=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg}", path=str(path), line=exc.lineno) from exc
    if not isinstance(raw, dict) or "logical_count" not in raw:
        raise DataError('expected an object with "logical_count": [[count per expert] per layer]', path=str(path))
    try:
        matrix = np.asarray(raw["logical_count"], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f'"logical_count" must be a rectangular matrix of numbers (layers x experts): {exc}', path=str(path)
        ) from exc
    if matrix.ndim == 3:
        matrix = matrix.sum(axis=0)  # per-pass or per-rank records: total over them
    return matrix


def _read_csv(path: Path) -> FloatArray:
    rows: list[list[float]] = []
    header_skipped = False
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc}", path=str(path)) from exc
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            row = [float(cell) for cell in text.split(",")]
        except ValueError as exc:
            if not rows and not header_skipped:
                header_skipped = True  # the first non-comment line may name the columns
                continue
            raise DataError(f"not a number: {exc}", path=str(path), line=number) from exc
        if rows and len(row) != len(rows[0]):
            raise DataError(f"{len(row)} columns, earlier rows have {len(rows[0])}", path=str(path), line=number)
        rows.append(row)
    return np.asarray(rows, dtype=np.float64)


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


@app.command("rebalance")
def rebalance(
    load: Annotated[Path, typer.Option("--load", help="Expert load: SGLang JSON, .npy or .csv (layers x experts).")],
    ranks: Annotated[int, typer.Option("--ranks", help="Expert-parallel ranks (GPUs).")],
    slots_per_rank: Annotated[int, typer.Option("--slots-per-rank", help="Expert slots per rank.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the placement JSON.")],
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes; > 1 keeps expert groups inside a node.")] = 1,
    groups: Annotated[int, typer.Option("--groups", help="Expert groups (hierarchical mode).")] = 1,
    previous: Annotated[
        Path | None, typer.Option("--previous", help="Current placement JSON: re-plan from it, moving few experts.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary on stdout.")] = False,
) -> None:
    """Plan a balanced expert placement and write it as JSON (loadable as an engine placement)."""
    with cli_errors():
        from contracts.placement import Placement
        from controller.rebalance import plan_rebalance

        matrix = read_expert_load(load)
        current = Placement.load(previous) if previous is not None else None
        started = time.perf_counter()
        plan = plan_rebalance(
            matrix, num_ranks=ranks, slots_per_rank=slots_per_rank, num_nodes=nodes, num_groups=groups,
            previous=current,
        )
        plan_ms = (time.perf_counter() - started) * 1000.0
        document = plan.to_json()
        document["plan_ms"] = plan_ms
        document["load_file"] = str(load)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document) + "\n")
        summary = _summary(document, out)
        if as_json:
            print_json(summary)
        else:
            _print_summary(summary)


def _summary(document: dict[str, Any], out: Path) -> dict[str, Any]:
    return {
        "out": str(out),
        "mode": document["mode"],
        "num_ranks": document["num_ranks"],
        "slots_per_rank": document["slots_per_rank"],
        "layers": len(document["phy2log"]),
        "active_layers": int(sum(document["active_layers"])),
        "total_moves": document["total_moves"],
        "plan_ms": document["plan_ms"],
        "imbalance_before": document["imbalance_before"]["summary"],
        "imbalance_after": document["imbalance_after"]["summary"],
    }


def _print_summary(summary: dict[str, Any]) -> None:
    before, after = summary["imbalance_before"], summary["imbalance_after"]
    console.print(
        f"[bold]{summary['mode']}[/] plan for {summary['num_ranks']} ranks x {summary['slots_per_rank']} slots, "
        f"{summary['active_layers']}/{summary['layers']} layers with load, in {summary['plan_ms']:.0f} ms"
    )
    console.print(
        f"max/mean avg {before['max_over_mean_avg']:.4f} -> {after['max_over_mean_avg']:.4f}, "
        f"worst {before['max_over_mean_worst']:.4f} -> {after['max_over_mean_worst']:.4f}; "
        f"CV worst {before['cv_worst']:.4f} -> {after['cv_worst']:.4f}; "
        f"{summary['total_moves']} expert moves; written to {summary['out']}"
    )


@bench_app.command("rebalance")
def bench_rebalance(
    data: Annotated[
        Path | None, typer.Option("--data", help="Folder of SGLang expert-load JSON files (default: shared data).")
    ] = None,
    max_files: Annotated[int, typer.Option("--max-files", help="Use at most this many files (0: all).")] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed runs of our planner per plan (best is kept).")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Our planner against DeepSeek's EPLB on real expert-load files: balance, plan time, re-plan moves."""
    with cli_errors():
        from bench.rebalance import expert_load_dir, run_benchmark

        result = run_benchmark(data or expert_load_dir(), max_files=max_files, repeat=repeat)
        if as_json:
            print_json(result)
        else:
            console.print_json(data=result)
