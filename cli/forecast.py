"""``moeslo forecast backtest``: rolling-origin WAPE of every forecaster on a trace."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, positive, print_json
from contracts.errors import ValidationError

forecast_app = typer.Typer(help="Forecasting of request rates.", no_args_is_help=True)


@forecast_app.command("backtest")
def backtest(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV, counts CSV).")],
    bin: Annotated[
        float, typer.Option("--bin", callback=positive, help="Bin width of the request-count series (s).")
    ] = 30.0,
    horizon: Annotated[
        list[float], typer.Option(help="Forecast horizon (s); repeat for several.", show_default=True)
    ] = [120.0],  # noqa: B006 -- typer needs a literal default
    refit_every: Annotated[
        float, typer.Option(callback=positive, help="Refit the models every this many seconds.")
    ] = 3600.0,
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

        from controller.forecast.trace_backtest import backtest_trace

        kinds = _checked_models(models, horizon, test_fraction)
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
        for note in report["notes"]:
            console.print(f"[yellow]note:[/] {note}")
        for name, entry in report["horizons"].items():
            console.print(f"[bold]horizon {name}[/] ({report['origins']} origins, {report['test']})")
            for model, score in sorted(entry["wape"].items(), key=lambda kv: math.inf if kv[1] is None else kv[1]):
                console.print(f"  {model:28s} WAPE " + ("-" if score is None else f"{score:.4f}"))
            ratio = entry.get("best_model_vs_best_baseline")
            if ratio is not None:
                console.print(
                    f"  best model / best baseline: {ratio:.3f} ({entry['best_model']} vs {entry['best_baseline']})"
                )


def _checked_models(models: str, horizon: list[float], test_fraction: float | None) -> list[str]:
    """The models named, each once; every problem with the options at once, before the trace is read."""
    from controller.forecast.backtest import MODEL_KINDS

    kinds = list(dict.fromkeys(m.strip() for m in models.split(",") if m.strip()))
    problems = [f"--horizon: {h} s is not a finite number above 0" for h in horizon if not 0 < h < math.inf]
    if not kinds:
        problems.append("--models: name at least one model")
    unknown = [k for k in kinds if k not in MODEL_KINDS]
    if unknown:
        problems.append(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODEL_KINDS)}")
    if test_fraction is not None and not 0 < test_fraction < 1:
        problems.append(f"--test-fraction: must be between 0 and 1, got {test_fraction}")
    if problems:
        raise ValidationError(problems)
    return kinds
