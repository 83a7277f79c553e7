"""``moeslo up``: the whole loop on one machine (see stack/run.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from cli.common import cli_errors, console, nonempty, positive, print_json

if TYPE_CHECKING:
    from harness.loadgen import ArrivalProcess
    from stack import StackOptions


def _arrivals(value: str) -> ArrivalProcess:
    if value not in ("even", "poisson"):
        raise typer.BadParameter(f"--arrivals must be even or poisson, got {value!r}")
    return cast("ArrivalProcess", value)


def _given(ctx: typer.Context) -> set[str]:
    """The trace-specific options set on the command line (a default one a trace ignores is no one's choice)."""
    from stack.load import COUNT_TRACE_OPTIONS, REQUEST_TRACE_OPTIONS

    # By name: typer carries click's ParameterSource in a copy of its own, not click's enum.
    sources = {name: ctx.get_parameter_source(name) for name in (*COUNT_TRACE_OPTIONS, *REQUEST_TRACE_OPTIONS)}
    return {name for name, source in sources.items() if source is not None and source.name != "DEFAULT"}


def _check_host(options: StackOptions, given: set[str]) -> None:
    """Refuse before anything starts what this machine cannot run or the load cannot replay (options ``given`` that
    the trace would ignore included); say when the fault falls outside the run."""
    from contracts.errors import ValidationError
    from stack.load import check_trace

    check_trace(options, given)

    if options.checkpoint is not None and not options.checkpoint.is_dir():
        raise ValidationError(f"--checkpoint {options.checkpoint}: no such directory")
    cpus = len(os.sched_getaffinity(0))
    if options.cpus_per_replica > cpus:
        raise ValidationError(f"--cpus-per-replica {options.cpus_per_replica}: this machine gives the run {cpus} "
                              "CPU(s), so no replica fits")  # fmt: skip
    if options.inject_slowdown and not options.fault_in_load:
        console.print(f"[dim]no fault in this run: --slowdown-at {options.slowdown_at_s:g} s is not before the end "
                      f"of the {options.duration_s:g} s of load (move it, or --no-inject-slowdown)[/]")
    elif options.fault_in_load and options.slowdown_at_s + options.slowdown_for_s > options.duration_s:
        console.print(f"[dim]the fault is cut short: --slowdown-at {options.slowdown_at_s:g} s + --slowdown-for "
                      f"{options.slowdown_for_s:g} s end past the {options.duration_s:g} s of load, and the fault "
                      f"ends with the load's last request (the summary says how long it ran)[/]")


def _run(options: StackOptions, *, live: bool) -> dict[str, Any]:
    """The run, shown live on a terminal or as lines; Ctrl-C says what was kept and exits 130."""
    from rich.live import Live

    from stack import run_stack
    from stack.shutdown import Interrupted, signals_deferred
    from stack.view import print_status_line, render

    try:
        if live and console.is_terminal:
            with Live(console=console, refresh_per_second=2, transient=False) as view:
                return run_stack(options, progress=view.update, on_update=lambda state: view.update(render(state)))
        return run_stack(options, progress=lambda text: console.print(f"[dim]{text}[/]"),
                         on_update=lambda state: print_status_line(state, console))
    except KeyboardInterrupt as stopped:
        with signals_deferred():  # one more Ctrl-C must not cut this line short
            _say_interrupted(stopped.still_running if isinstance(stopped, Interrupted) else None,
                             options.out / "summary.json")
        raise typer.Exit(code=130) from None


def _say_interrupted(still: list[str] | None, kept: Path) -> None:
    if still is None:  # Ctrl-C outside the run's own handling: nothing checked
        said = "interrupted"
    elif still:
        said = f"interrupted: still running after the stop: {', '.join(still)}"
    else:
        said = "interrupted: every process the run started is stopped"
    console.print(said + (f"; what it saw until then is in {kept}" if kept.is_file() else ""))


# long: a typer command is its option list; the work is in stack/.
def up(
    ctx: typer.Context,
    duration: Annotated[float, typer.Option(callback=positive, help="Seconds of load before the summary.")] = 120.0,
    out_folder: Annotated[
        str, typer.Option("--out", callback=nonempty, help="Folder for logs, state, summary.json and plots (a run's "
                                                           "own).")
    ] = "demo-out",
    checkpoint_dir: Annotated[
        str | None, typer.Option("--checkpoint", callback=nonempty, help="Checkpoint (default: random, skewed router).")
    ] = None,
    ep: Annotated[int, typer.Option(min=1, help="Expert-parallel ranks per engine replica.")] = 2,
    max_replicas: Annotated[int, typer.Option(min=1, help="Most engine replicas the controller may start.")] = 2,
    cpus_per_replica: Annotated[int, typer.Option(min=1, help="CPUs pinned to each replica (the host budget).")] = 1,
    speedup: Annotated[
        float, typer.Option(callback=positive, help="Time compression of a request --trace (a request trace only: "
                                                    "refused with a count trace, the default).")
    ] = 1.0,
    trace: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False,
                     help="Trace file: request counts (its 04:00-16:00 UTC replayed, compressed into --duration) or "
                          "requests (its first --duration x --speedup seconds); checked before anything starts. "
                          "Default: a bundled day of Azure 2024 counts."),
    ] = None,
    base_load: Annotated[
        float, typer.Option(callback=positive, help="The quiet start of the load, as a share of the capacity "
                                                    "model's rate a replica (a count trace only).")
    ] = 0.7,
    arrivals: Annotated[
        str, typer.Option(help="Arrivals of the count trace: even (its shape and length mix at full "
                                 "volume) or poisson (a small service's noise, lengths drawn independently); "
                                 "a count trace only.")
    ] = "even",
    inject_slowdown: Annotated[
        bool, typer.Option(help="Throttle every replica's CPU part-way through (a fault that pages).")
    ] = True,
    slowdown_at: Annotated[float, typer.Option(min=0, help="Seconds into the load when the fault starts.")] = 62.0,
    slowdown_for: Annotated[
        float, typer.Option(callback=positive, help="Seconds the fault lasts (at most until the load ends).")
    ] = 28.0,
    prometheus: Annotated[bool, typer.Option(help="Start Prometheus and Alertmanager when installed.")] = True,
    router: Annotated[
        bool, typer.Option(help="Send the load through the entry router (cost policy); off: straight to replicas.")
    ] = True,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the random checkpoint, the load's draws and the profile's arrivals.")
    ] = 0,
    live: Annotated[bool, typer.Option(help="Live terminal view.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Start engine, controller, Prometheus and Alertmanager, replay load, show the loop, then summarize."""
    from stack import StackOptions

    out, checkpoint = Path(out_folder), None if checkpoint_dir is None else Path(checkpoint_dir)
    options = StackOptions(duration_s=duration, out=out, checkpoint=checkpoint, ep=ep, max_replicas=max_replicas,
                           cpus_per_replica=cpus_per_replica, speedup=speedup, trace=trace, base_load=base_load,
                           arrivals=_arrivals(arrivals), inject_slowdown=inject_slowdown,
                           slowdown_at_s=slowdown_at, slowdown_for_s=slowdown_for, prometheus=prometheus, router=router,
                           seed=seed)
    with cli_errors():
        _check_host(options, _given(ctx))
        summary = _run(options, live=live)
    if json_out:
        print_json(summary)
        _check_loop(summary)
        return
    table_rows = [(k, v) for k, v in summary.items() if k not in ("events", "plots", "profile", "pages")]
    for key, value in table_rows:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        console.print(f"  {key:28} {shown}")
    console.print("events:")
    for line in summary["events"]:
        console.print(f"  {line}")
    console.print(f"plots: {', '.join(summary['plots'])}  summary: {out / 'summary.json'}")
    _check_loop(summary)


def _check_loop(summary: dict[str, Any]) -> None:
    """Exit 1, saying why, when the controller died during the run or a process outlived the stop."""
    exited = summary.get("controller_exit")
    if exited:
        console.print(f"[red]the control loop was dead for the last {exited['loop_dead_s']:g} s: the controller "
                      f"exited with code {exited['code']} at {exited['at_s']:g} s[/]")
    if summary.get("still_running"):
        console.print(f"[red]still running after the stop: {', '.join(summary['still_running'])}[/]")
    if not summary.get("control_loop_ok", True):
        raise typer.Exit(code=1)
