"""``moeslo replay``: one trace, several scaling strategies (or every knob of each: ``--sweep``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import at_least, cli_errors, console, nonempty, positive, print_json
from cli.lists import integers
from contracts.errors import DataError, ValidationError
from contracts.slo_defaults import LEAD_TIME_S

if TYPE_CHECKING:
    from controller.replay.protocol import ReplayRequest

DEFAULT_POLICIES = "static,hpa,keda-queue,keda-kv,dynamo,dynamo-load,moeslo,oracle"


def _allowance(value: float) -> float:
    """An option's callback: a TTFT allowance of 0 or more, spelt exactly by its series' label (6 digits)."""
    from contracts.ttft_objective import format_allowance_label, label_keeps

    at_least(0.0)(value)
    if not label_keeps(value):
        raise typer.BadParameter(f"at most 6 significant digits (its series label reads "
                                 f"{format_allowance_label(value)}), got {value}")
    return value


# long: a typer command is its option list; the work is in controller.replay.
def replay(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV, counts CSV).")],
    policies: Annotated[
        str, typer.Option(help="Policies, each optionally with knobs: 'static,hpa:target=0.6'; when a policy has "
                               "several knobs, ';' separates the policies: 'moeslo:cooldown_s=180,quantile=0.9;hpa'.")
    ] = DEFAULT_POLICIES,
    sweep: Annotated[bool, typer.Option("--sweep", help="Run each policy over its knob grid; draw frontiers.")] = False,
    out_dir: Annotated[
        str, typer.Option("--out", callback=nonempty, help="Directory for the JSON summary and the PNG plots.")
    ] = "replay-out",
    speedup: Annotated[
        float, typer.Option(callback=positive, help="Replay this many times faster (arrival times divided).")
    ] = 1.0,
    rate_scale: Annotated[
        float, typer.Option(callback=positive, help="This many times the requests over the same span.")
    ] = 1.0,
    tokens_per_s: Annotated[
        float | None, typer.Option(callback=positive, help="Scale the rate so prompt + output tokens/s average this.")
    ] = None,
    profile: Annotated[Path | None, typer.Option(help="Replica profile JSON the controllers hold.")] = None,
    lengths: Annotated[
        str, typer.Option(help="Token lengths for count traces: azure-2023-conv, azure-2023-code, fixed:P,O, a path.")
    ] = "azure-2023-conv",
    mode: Annotated[str, typer.Option(help="request (every request), fluid (per-tick aggregate) or auto.")] = "auto",
    tick: Annotated[
        float, typer.Option(callback=positive, help="Controller tick and HPA sync period (s).")
    ] = 15.0,
    startup: Annotated[
        float, typer.Option(callback=at_least(0.0), help="Replica start-up time, also every lead time (s).")
    ] = float(
        LEAD_TIME_S
    ),
    startup_jitter: Annotated[
        float, typer.Option(callback=at_least(0.0, 1.0, high_open=True), help="Each start-up is startup x U(1-j, 1+j).")
    ] = 0.0,
    capacity_error: Annotated[
        float, typer.Option(callback=at_least(-0.9, 10.0), help="True capacity over the profile's, minus 1 (-0.2).")
    ] = 0.0,
    drift_per_day: Annotated[
        float, typer.Option(callback=at_least(-1.0, 10.0, low_open=True, high_open=True),
                            help="True capacity drift per simulated day (-0.05).")
    ] = 0.0,
    prompt_tail: Annotated[
        float, typer.Option(callback=at_least(1.0, 100.0), help="Prompts beyond their p90 get the excess x this.")
    ] = 1.0,
    scrape: Annotated[float, typer.Option(callback=positive, help="Prometheus scrape interval (s).")] = 30.0,
    ttft_per_1k: Annotated[
        float, typer.Option(callback=_allowance,
                            help="TTFT objective's allowance per 1,000 prompt tokens beyond the reference (s).")
    ] = 0.0,
    ttft_reference_tokens: Annotated[
        int, typer.Option(min=0, max=10_000_000, help="Prompt length the TTFT threshold is stated for (tokens).")
    ] = 1000,
    warmup: Annotated[float, typer.Option(callback=at_least(0.0), help="Scored apart at the start (s).")] = 1800.0,
    window: Annotated[
        list[str] | None, typer.Option(help="Extra scoring windows NAME=START:END in seconds (END may be empty).")
    ] = None,
    tuned_from: Annotated[
        Path | None, typer.Option(help="A sweep.json to take each policy's tuned knobs from (with --sweep).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Worker processes for --sweep.", min=1)] = 2,
    refit_every: Annotated[int, typer.Option(min=1, help="Refit moeslo's forecaster every this many ticks.")] = 240,
    start: Annotated[
        float, typer.Option(callback=at_least(0.0), help="Start this many seconds into the trace.")
    ] = 0.0,
    duration: Annotated[
        float | None, typer.Option(callback=positive, help="Replay only this many seconds of the trace.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for rate scaling, length draws and start-up draws.")] = 0,
    router: Annotated[
        str | None, typer.Option(help="Compare the entry router's policies at fixed fleet sizes instead: "
                                      "cost,least-loaded,round-robin,prefix (any of them).")
    ] = None,
    replicas: Annotated[
        str | None, typer.Option(help="With --router: fleet sizes, comma-separated (default: around the peak need).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary JSON to stdout.")] = False,
) -> None:
    """Compare scaling strategies on a trace in a world the controllers do not know."""
    out = Path(out_dir)
    with cli_errors():
        from controller.replay.protocol import ReplayRequest, parse_policies, replay_once, replay_sweep
        from controller.replay.settings import sweep_settings

        request = ReplayRequest(
            trace=trace, speedup=speedup, rate_scale=rate_scale, tokens_per_s=tokens_per_s, profile=profile,
            lengths=lengths, mode=mode, tick_s=tick, startup_s=startup, startup_jitter=startup_jitter,
            capacity_error=capacity_error, drift_per_day=drift_per_day, prompt_tail=prompt_tail, scrape_s=scrape,
            warmup_s=warmup, refit_every=refit_every, start_s=start, duration_s=duration, seed=seed,
            ttft_per_1k_s=ttft_per_1k, ttft_reference_tokens=ttft_reference_tokens,
        )  # fmt: skip
        if (window or tuned_from is not None) and not sweep:
            raise ValidationError("--window and --tuned-from apply to --sweep only")
        if tuned_from is not None and not tuned_from.is_file():
            raise DataError("--tuned-from: no such file", path=str(tuned_from))
        names = [p.strip() for p in policies.split(",") if p.strip()]
        if router is None:  # a knob out of range fails now, not after the trace is read
            sweep_settings(names) if sweep else parse_policies(policies)
        out.mkdir(parents=True, exist_ok=True)  # a file in the way fails now, not after every run
        if router is not None:
            _compare_routers(request, router, replicas, out, json_out=json_out)
            return
        if sweep:
            with _progress(transient=json_out) as progress:
                summary = replay_sweep(
                    request, names, out, windows=window or [], tuned_from=tuned_from, workers=workers,
                    progress=progress,
                )  # fmt: skip
            _print_sweep(summary, out, json_out=json_out)
            return
        with _progress(transient=json_out) as progress:
            summary = replay_once(request, policies, out, progress=progress)
        if json_out:
            print_json(summary)
            return
        for name, entry in summary["policies"].items():
            s = entry["scored"]
            console.print(
                f"{name:>40}: {s['attainment_both']:.4f} within both SLOs, {s['replica_hours']:.2f} replica-h, "
                f"worst hour {s['worst_hour_attainment']}, {s['scale_events_per_hour']:.1f} scale events/h"
            )
        console.print(f"wrote {out / 'summary.json'} and {len(summary['plots'])} plot(s)")


def _compare_routers(request: ReplayRequest, router: str, replicas: str | None, out: Path, *, json_out: bool) -> None:
    from bench.router_replay import compare_routers

    sizes = integers("--replicas", replicas) if replicas else None
    if sizes is not None and any(n < 1 for n in sizes):
        raise ValidationError(f"--replicas: fleet sizes of 1 or more are needed, got {replicas!r}")
    summary = compare_routers(request, [p.strip() for p in router.split(",") if p.strip()], sizes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routers.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")  # null, never NaN
    if json_out:
        print_json(summary)
        return
    for name, rows in summary["results"].items():
        cells = "  ".join(f"{r['replicas']}: {r['attainment_both']:.4f} (TTFT {r['attainment_ttft']:.4f}, ITL "
                          f"{r['attainment_itl']:.4f}) p99 {r['ttft_p99_s']}" for r in rows)  # fmt: skip
        console.print(f"{name:>20}  {cells}")
    floor = summary["floor"]
    console.print(f"{'floor':>20}  every request alone on one of {floor['replicas']} replicas: p99 "
                  f"{floor['ttft_p99_s']} (no policy goes below it but by prefix-cache hits)")
    console.print(f"replicas for {summary['goal_attainment']:.0%}: {summary['replicas_for_goal']}; "
                  f"ratios {summary['ratios']}; wrote {out / 'routers.json'}")


@contextmanager
def _progress(*, transient: bool) -> Iterator[Callable[[str, int, int], None]]:
    """One bar over the runs (each run is one policy setting over the whole trace)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as bar:
        task = bar.add_task("replaying", total=None)

        def update(label: str, done: int, total: int) -> None:
            bar.update(task, description=label[:44], completed=done, total=total)

        yield update


def _print_sweep(summary: dict[str, Any], out: Path, *, json_out: bool) -> None:
    if json_out:
        print_json(summary)
        return
    windows = summary["windows"]
    assert isinstance(windows, dict)
    for name, body in windows.items():
        console.print(f"[bold]{name}[/bold]")
        for level, entry in body["at_attainment"].items():
            parts = []
            for policy, value in entry["policies"].items():
                hours = value["replica_hours"]
                mark = {"at_most": "<=", "unreachable": "", "interpolated": ""}[value["kind"]]
                parts.append(f"{policy} {mark}{hours:.1f}" if hours is not None else f"{policy} -")
            ratio = entry["ratio_to_best_baseline"]
            tail = f" | moeslo / best baseline: {ratio} ({entry['ratio_kind']})"
            console.print(f"  {level}: " + ", ".join(parts) + tail)
    console.print(f"wrote {out / 'sweep.json'} and {len(summary['plots'])} plot(s) in {summary['wall_s']} s")


__all__ = ["DEFAULT_POLICIES", "replay"]
