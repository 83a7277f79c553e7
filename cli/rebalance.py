"""``moeslo rebalance``: plan an expert placement from one or more expert-load files.

Each load file is read by :mod:`controller.rebalance.load_files` (SGLang's
expert-distribution JSON, an engine's expert-load JSON as ``GET /v1/expert-load``
or vLLM's ``GET /moeslo/eplb`` serves it, or a ``.npy`` / ``.csv`` matrix).  Several ``--load``
files are windows of one model's load (oldest first), planned against together
(:func:`controller.rebalance.history.plan_over_windows`).  The output JSON
loads with ``Placement.from_json`` and adds moves, imbalance before and
after (on the summed windows, and per window), and the planning time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import cli_errors, console, nonempty, print_json


def rebalance(
    load: Annotated[
        list[Path],
        typer.Option("--load", help="Expert load (layers x experts): SGLang JSON, a saved GET /v1/expert-load or "
                                    "vLLM's GET /moeslo/eplb, .npy or .csv; repeat for several windows of the same "
                                    "model, oldest first, to plan against all of them."),
    ],
    ranks: Annotated[int, typer.Option("--ranks", min=1, help="Expert-parallel ranks (GPUs).")],
    slots_per_rank: Annotated[int, typer.Option("--slots-per-rank", min=1, help="Expert slots per rank.")],
    out_file: Annotated[str, typer.Option("--out", callback=nonempty, help="Where to write the placement JSON.")],
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Nodes; > 1 keeps expert groups inside a node.")] = 1,
    groups: Annotated[int, typer.Option("--groups", min=1, help="Expert groups (hierarchical mode).")] = 1,
    previous: Annotated[
        Path | None, typer.Option("--previous", help="Current placement JSON: re-plan from it, moving few experts.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary on stdout.")] = False,
) -> None:
    """Plan a balanced expert placement and write it as JSON (loadable as an engine placement)."""
    out = Path(out_file)
    with cli_errors():
        from contracts.errors import ValidationError
        from contracts.placement import Placement
        from controller.rebalance.allocator import keep_freed_memory
        from controller.rebalance.history import plan_over_windows
        from controller.rebalance.load_files import read_expert_loads

        keep_freed_memory()
        windows = read_expert_loads(load)
        current = Placement.load(previous) if previous is not None else None
        if current is not None and (current.num_ranks, current.slots_per_rank) != (ranks, slots_per_rank):
            raise ValidationError(f"--previous {previous} is for {current.num_ranks} ranks x {current.slots_per_rank} "
                                  f"slots per rank, not the --ranks {ranks} x --slots-per-rank {slots_per_rank} "
                                  "asked for")  # fmt: skip
        started = time.perf_counter()
        plan = plan_over_windows(
            windows, num_ranks=ranks, slots_per_rank=slots_per_rank, num_nodes=nodes, num_groups=groups,
            previous=current,
        )
        plan_ms = (time.perf_counter() - started) * 1000.0
        document = plan.to_json()
        document["plan_ms"] = plan_ms
        document["load_file"] = str(load[0])
        document["load_files"] = [str(path) for path in load]
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
        "windows": document.get("windows", 1),
        "imbalance_after_per_window": document.get("imbalance_after_per_window", []),
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
