"""``moeslo replay``: one trace, several scaling strategies, identical simulated fleets."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import cli_errors, console, print_json
from contracts.slo_defaults import LEAD_TIME_S, SCALE_DOWN_COOLDOWN_S

if TYPE_CHECKING:
    from controller.capacity import ReplicaProfile
    from controller.replay.runner import PolicyRun, ReplayConfig
    from controller.replay.workload import Workload

DEFAULT_POLICIES = "static,hpa,dynamo,moeslo,oracle"


def replay(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV, counts CSV).")],
    policies: Annotated[str, typer.Option(help="Comma-separated policies to compare.")] = DEFAULT_POLICIES,
    out: Annotated[Path, typer.Option(help="Directory for summary.json and the PNG plots.")] = Path("replay-out"),
    speedup: Annotated[float, typer.Option(help="Replay this many times faster (arrival times divided).")] = 1.0,
    rate_scale: Annotated[float, typer.Option(help="This many times the requests over the same span.")] = 1.0,
    tokens_per_s: Annotated[
        float | None, typer.Option(help="Scale the rate so prompt + output tokens/s average this.")
    ] = None,
    profile: Annotated[Path | None, typer.Option(help="Replica profile JSON (moeslo profile).")] = None,
    lengths: Annotated[
        str, typer.Option(help="Token lengths for count traces: azure-2023-conv, azure-2023-code, fixed:P,O, a path.")
    ] = "azure-2023-conv",
    mode: Annotated[str, typer.Option(help="request (every request), fluid (per-tick aggregate) or auto.")] = "auto",
    tick: Annotated[float, typer.Option(help="Controller tick (s).")] = 15.0,
    startup: Annotated[float, typer.Option(help="Replica start-up time = lead time (s).")] = float(LEAD_TIME_S),
    cooldown: Annotated[int, typer.Option(help="Scale-down cooldown of moeslo (s).")] = SCALE_DOWN_COOLDOWN_S,
    quantile: Annotated[float, typer.Option(help="Forecast quantile moeslo sizes for.")] = 0.9,
    refit_every: Annotated[int, typer.Option(help="Refit moeslo's forecaster every this many ticks.")] = 240,
    start: Annotated[float, typer.Option(help="Start this many seconds into the trace.")] = 0.0,
    duration: Annotated[float | None, typer.Option(help="Replay only this many seconds of the trace.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for rate scaling and length draws.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary JSON to stdout.")] = False,
) -> None:
    """Compare static, HPA, Dynamo-style, moeslo and oracle scaling on a trace."""
    with cli_errors():
        import time

        from controller.capacity import DEFAULT_PROFILE, ReplicaProfile
        from controller.replay.report import write_report
        from controller.replay.runner import ReplayConfig
        from controller.replay.workload import prepare_workload

        names = [p.strip() for p in policies.split(",") if p.strip()]
        replica = ReplicaProfile.load(profile) if profile is not None else DEFAULT_PROFILE
        began, began_cpu = time.perf_counter(), time.process_time()
        workload = prepare_workload(
            trace, tick_s=tick, mode=mode, lengths=lengths, speedup=speedup, rate_scale=rate_scale, start_s=start,
            duration_s=duration, tokens_per_s=tokens_per_s, seed=seed,
        )
        config = ReplayConfig(
            tick_s=tick, startup_s=startup, cooldown_s=cooldown, quantile=quantile, refit_every_ticks=refit_every
        )
        runs = _run_with_progress(workload, names, replica, config, transient=not json_out)
        timings = {"wall_s": round(time.perf_counter() - began, 2), "cpu_s": round(time.process_time() - began_cpu, 2)}
        summary = write_report(workload, runs, replica, out, startup_s=startup, timings=timings)
        if json_out:
            print_json(summary)
            return
        for name, entry in summary["policies"].items():
            console.print(
                f"{name:>8}: {entry['attainment_both']:.4f} within both SLOs, "
                f"{entry['replica_hours']:.2f} replica-h, {entry['scale_events']} scale events"
            )
        console.print(f"wrote {out / 'summary.json'} and {len(summary['plots'])} plot(s)")


def _run_with_progress(
    workload: Workload, names: list[str], replica: ReplicaProfile, config: ReplayConfig, *, transient: bool
) -> list[PolicyRun]:
    """Run every strategy with one progress bar each."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from controller.replay.runner import run_replay

    columns = (TextColumn("{task.description:>8}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as progress:
        tasks = {name: progress.add_task(name, total=workload.ticks) for name in names}
        step = max(1, workload.ticks // 200)

        def on_tick(name: str, k: int) -> None:
            if k % step == 0 or k == workload.ticks - 1:
                progress.update(tasks[name], completed=k + 1)

        return run_replay(workload, names, replica, config, on_tick=on_tick)
