"""``moeslo bench controller``: time one decision-core tick over a synthetic fleet."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import bench_app, console, print_json


@bench_app.command("controller")
def bench_controller(
    policies: Annotated[int, typer.Option(min=1, help="SLO policies in the fleet.")] = 100,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas over all policies.")] = 1000,
    ticks: Annotated[int, typer.Option(min=1, help="Timed ticks (after the warm-up).")] = 300,
    warmup_ticks: Annotated[int, typer.Option(min=0, help="Untimed ticks first.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet.")] = 0,
    goal_ms: Annotated[float, typer.Option(min=0.0, help="Goal for the p99 of one full tick.")] = 100.0,
    predictive: Annotated[
        bool, typer.Option("--predictive", help="Add the predictive advisor (forecasts) to the full tick.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """One tick over POLICIES policies and REPLICAS replicas: median and p99 against a baseline."""
    from rich.progress import Progress

    from bench.controller import ControllerBenchConfig, run_controller_bench

    try:
        cfg = ControllerBenchConfig(
            policies=policies,
            replicas=replicas,
            ticks=ticks,
            warmup_ticks=warmup_ticks,
            seed=seed,
            goal_ms=goal_ms,
            predictive=predictive,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("controller ticks", total=cfg.warmup_ticks + cfg.ticks)
        figures = run_controller_bench(cfg, progress=lambda done, _total: bar.update(task, completed=done))
    if json_output:
        print_json(figures)
        return
    baseline = figures["baseline"]
    assert isinstance(baseline, dict)
    console.print(
        f"baseline {baseline['name']}: median {baseline['median_ms']:.3f} ms, p99 {baseline['p99_ms']:.3f} ms "
        f"(cpu median {baseline['cpu_median_ms']:.3f} ms)"
    )
    results = figures["results"]
    assert isinstance(results, list)
    for result in results:
        console.print(
            f"{result['name']}: median {result['median_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms "
            f"(cpu median {result['cpu_median_ms']:.3f} ms, p99 {result['cpu_p99_ms']:.3f} ms; "
            f"{result['median_ratio_vs_baseline']:.2f}x baseline median)"
        )
    verdict = "meets" if figures["meets_goal"] else "MISSES"
    console.print(f"{verdict} the goal: p99 of a full tick <= {cfg.goal_ms:g} ms")
