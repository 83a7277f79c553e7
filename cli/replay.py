"""``moeslo replay``: one trace, several scaling policies, identical simulated fleets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import bench_app, cli_errors, console, print_json
from cli.main import app
from contracts.slo_defaults import LEAD_TIME_S, SCALE_DOWN_COOLDOWN_S

DEFAULT_POLICIES = "static,hpa,dynamo,moeslo,oracle"


def prepare_workload(
    trace_path: Path,
    *,
    tick_s: float,
    mode: str,
    lengths: str,
    speedup: float,
    rate_scale: float,
    start_s: float,
    duration_s: float | None,
    tokens_per_s: float | None,
    seed: int,
) -> Any:
    """Load, window, speed up and scale a trace into a :class:`Workload`."""
    from contracts.traces import CountTrace, RequestTrace, load_trace
    from controller.replay import resolve_lengths
    from controller.replay.harness import make_workload

    trace: RequestTrace | CountTrace = load_trace(trace_path)
    length_dist = resolve_lengths(lengths) if isinstance(trace, CountTrace) else None
    if isinstance(trace, CountTrace):
        if start_s or duration_s is not None:
            first = int(start_s // trace.bin_s)
            last = len(trace.counts) if duration_s is None else first + int(duration_s // trace.bin_s)
            trace = CountTrace(trace.source, trace.bin_s, trace.counts[first:last], trace.start_epoch_s)
    elif start_s or duration_s is not None:
        trace = trace.window(start_s, start_s + (duration_s if duration_s is not None else trace.duration_s))
    if tokens_per_s is not None:
        # Scale the rate so the mean prompt + output tokens/s match the target.
        if isinstance(trace, CountTrace):
            assert length_dist is not None
            per_request = length_dist.mean_prompt_tokens + length_dist.mean_output_tokens
            current = trace.total_requests * per_request / trace.duration_s
        else:
            current = float(trace.prompt_tokens.sum() + trace.output_tokens.sum()) / max(trace.duration_s, 1e-9)
        rate_scale *= tokens_per_s / current
    if speedup != 1.0:
        trace = trace.speedup(speedup)
    if rate_scale != 1.0:
        trace = trace.rate_scale(rate_scale, seed=seed)
    if mode == "auto":
        mode = "fluid" if isinstance(trace, CountTrace) else "request"
    if mode not in ("request", "fluid"):
        raise typer.BadParameter(f"mode must be request, fluid or auto, got {mode!r}")
    return make_workload(trace, tick_s=tick_s, mode=mode, lengths=length_dist, seed=seed)  # type: ignore[arg-type]


@app.command("replay")
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

        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from controller.capacity import DEFAULT_PROFILE, ReplicaProfile
        from controller.replay.harness import ReplayConfig, run_replay, summarise
        from controller.replay.plots import plot_forecast, plot_replicas

        names = [p.strip() for p in policies.split(",") if p.strip()]
        replica = ReplicaProfile.load(profile) if profile is not None else DEFAULT_PROFILE
        began = time.perf_counter()
        began_cpu = time.process_time()
        workload = prepare_workload(
            trace,
            tick_s=tick,
            mode=mode,
            lengths=lengths,
            speedup=speedup,
            rate_scale=rate_scale,
            start_s=start,
            duration_s=duration,
            tokens_per_s=tokens_per_s,
            seed=seed,
        )
        config = ReplayConfig(
            tick_s=tick, startup_s=startup, cooldown_s=cooldown, quantile=quantile, refit_every_ticks=refit_every
        )
        with Progress(
            TextColumn("{task.description:>8}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=console,
            transient=not json_out,
        ) as progress:
            tasks = {name: progress.add_task(name, total=workload.ticks) for name in names}
            step = max(1, workload.ticks // 200)

            def on_tick(name: str, k: int) -> None:
                if k % step == 0 or k == workload.ticks - 1:
                    progress.update(tasks[name], completed=k + 1)

            runs = run_replay(workload, names, replica, config, on_tick=on_tick)
        summary = summarise(workload, runs, replica)
        summary["wall_s"] = round(time.perf_counter() - began, 2)
        summary["cpu_s"] = round(time.process_time() - began_cpu, 2)
        summary["profile_source"] = replica.source
        out.mkdir(parents=True, exist_ok=True)
        plots = [str(plot_replicas(workload, runs, out / "replicas.png"))]
        for run in runs:
            drawn = plot_forecast(workload, run, startup, out / f"forecast_{run.name}.png")
            if drawn is not None:
                plots.append(str(drawn))
        summary["plots"] = plots
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if json_out:
            print_json(summary)
            return
        policy_entries: dict[str, Any] = summary["policies"]  # type: ignore[assignment]
        for name, entry in policy_entries.items():
            console.print(
                f"{name:>8}: {entry['attainment_both']:.4f} within both SLOs, "
                f"{entry['replica_hours']:.2f} replica-h, {entry['scale_events']} scale events"
            )
        console.print(f"wrote {out / 'summary.json'} and {len(plots)} plot(s)")


@bench_app.command("replay")
def bench_replay(
    cases: Annotated[str, typer.Option(help="Comma-separated: conv10x, week, fluid_day.")] = "conv10x,week,fluid_day",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout.")] = False,
) -> None:
    """Attainment, replica-hours and replay speed per policy on the shared traces."""
    with cli_errors():
        from bench.replay import run

        with console.status("replaying the shared traces through every policy"):
            report = run(cases=tuple(c.strip() for c in cases.split(",") if c.strip()))
        if json_out:
            print_json(report)
            return
        for name, case in report["cases"].items():
            console.print(f"[bold]{name}[/] {case['checks']}")
