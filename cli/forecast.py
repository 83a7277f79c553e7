"""``moeslo forecast backtest``: rolling-origin WAPE of every forecaster on a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import bench_app, cli_errors, console, print_json
from cli.main import app

forecast_app = typer.Typer(help="Forecasting of request rates.", no_args_is_help=True)
app.add_typer(forecast_app, name="forecast")

DAY_S = 86_400.0


def backtest_trace(
    trace_path: Path,
    *,
    bin_s: float,
    horizons_s: list[float],
    refit_every_s: float,
    models: list[str],
    test_fraction: float | None = None,
    on_model_done: Any = None,
) -> dict[str, Any]:
    """Backtest ``models`` on the request counts of a trace; the test part is the last whole days
    (two of them when the series has four or more) or the last ``test_fraction``."""
    import numpy as np

    from contracts.traces import load_trace
    from controller.forecast import BASELINES, compare_models
    from controller.replay.series import request_counts

    trace = load_trace(trace_path)
    series = request_counts(trace, bin_s)
    span_s = len(series) * bin_s
    steps = sorted({max(1, round(h / bin_s)) for h in horizons_s})
    day_bins = round(DAY_S / bin_s)
    if test_fraction is None and span_s >= 4 * DAY_S:
        start = len(series) - 2 * day_bins
        split = "last 2 days"
    else:
        fraction = test_fraction if test_fraction is not None else 0.5
        start = int(len(series) * (1 - fraction))
        split = f"last {fraction:.0%}"
    period = day_bins if start >= 2 * day_bins else None
    results = compare_models(
        series,
        models,
        period=period,
        horizons=steps,
        start=start,
        refit_every=max(1, round(refit_every_s / bin_s)),
        history_bins=len(series) if period is not None else 720,
        on_model_done=on_model_done,
    )
    by_horizon: dict[str, Any] = {}
    for h in steps:
        scores = {r.name: round(r.wape_by_horizon[h], 5) for r in results}
        baselines = {r.name: r.wape_by_horizon[h] for r in results if r.kind in BASELINES}
        models_only = {r.name: r.wape_by_horizon[h] for r in results if r.kind not in BASELINES}
        best_baseline = min(baselines, key=lambda k: baselines[k]) if baselines else None
        best_model = min(models_only, key=lambda k: models_only[k]) if models_only else None
        entry: dict[str, Any] = {"horizon_s": h * bin_s, "wape": scores}
        if best_baseline is not None and best_model is not None:
            entry["best_baseline"] = best_baseline
            entry["best_model"] = best_model
            entry["best_model_vs_best_baseline"] = round(models_only[best_model] / baselines[best_baseline], 4)
        by_horizon[f"{h * bin_s:g}s"] = entry
    return {
        "trace": str(trace_path),
        "bin_s": bin_s,
        "bins": len(series),
        "mean_per_bin": round(float(np.mean(series)), 3),
        "test": split,
        "origins": len(results[0].origins) if results else 0,
        "seasonal_period_bins": period,
        "refit_every_bins": max(1, round(refit_every_s / bin_s)),
        "fit_seconds": {r.name: round(r.fit_seconds, 2) for r in results},
        "horizons": by_horizon,
    }


@forecast_app.command("backtest")
def backtest(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV, counts CSV).")],
    bin: Annotated[float, typer.Option("--bin", help="Bin width of the request-count series (s).")] = 30.0,
    horizon: Annotated[
        list[float], typer.Option(help="Forecast horizon (s); repeat for several.", show_default=True)
    ] = [120.0],  # noqa: B006 -- typer needs a literal default
    refit_every: Annotated[float, typer.Option(help="Refit the models every this many seconds.")] = 3600.0,
    models: Annotated[
        str, typer.Option(help="Comma-separated: last_value,moving_average,seasonal_naive,holt_damped,arima.")
    ] = "last_value,moving_average,seasonal_naive,holt_damped,arima",
    test_fraction: Annotated[
        float | None, typer.Option(help="Test on this last share of the series (default: last 2 days or 50%).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout.")] = False,
) -> None:
    """WAPE per model and horizon, baselines (last value, moving average, seasonal naive) included."""
    with cli_errors():
        from rich.progress import Progress

        kinds = [m.strip() for m in models.split(",") if m.strip()]
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("backtesting", total=len(kinds))
            report = backtest_trace(
                trace,
                bin_s=bin,
                horizons_s=horizon,
                refit_every_s=refit_every,
                models=kinds,
                test_fraction=test_fraction,
                on_model_done=lambda result: progress.advance(task),
            )
        if json_out:
            print_json(report)
            return
        for name, entry in report["horizons"].items():
            console.print(f"[bold]horizon {name}[/] ({report['origins']} origins, {report['test']})")
            for model, score in sorted(entry["wape"].items(), key=lambda kv: kv[1]):
                console.print(f"  {model:28s} WAPE {score:.4f}")
            if "best_model_vs_best_baseline" in entry:
                console.print(
                    f"  best model / best baseline: {entry['best_model_vs_best_baseline']:.3f} "
                    f"({entry['best_model']} vs {entry['best_baseline']})"
                )


@bench_app.command("forecast")
def bench_forecast(
    bin: Annotated[float, typer.Option("--bin", help="Bin width (s).")] = 30.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout.")] = False,
) -> None:
    """WAPE of our forecasters against the best baseline on the shared traces."""
    with cli_errors():
        from bench.forecast import run

        with console.status("backtesting forecasters on the shared traces"):
            report = run(bin_s=bin, on_case=lambda name: console.print(f"done: {name}"))
        if json_out:
            print_json(report)
            return
        for name, case in report["cases"].items():
            for horizon, entry in case["horizons"].items():
                console.print(
                    f"{name} {horizon}: best model {entry.get('best_model')} / best baseline "
                    f"{entry.get('best_baseline')} = {entry.get('best_model_vs_best_baseline')}"
                )
