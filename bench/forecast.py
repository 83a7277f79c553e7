"""Forecast benchmark: rolling-origin WAPE of our models against the best baseline, same run.

Goal (issue 6): WAPE <= 0.9x the best baseline's (last value, moving average, seasonal naive)
at a 120 s horizon, and at a 10-minute horizon on the week-long Azure 2024 conversation counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.datadir import default_data_dir
from controller.forecast.trace_backtest import backtest_trace

GOAL_RATIO = 0.9

CASES = (
    ("azure-2024-conv-week", ("azure-llm-2024", "invocations_ten_second_Conversation.csv"), (120.0, 600.0)),
    ("azure-2023-conv-hour", ("azure-llm-2023", "AzureLLMInferenceTrace_conv.csv"), (120.0,)),
    ("azure-2023-code-hour", ("azure-llm-2023", "AzureLLMInferenceTrace_code.csv"), (120.0,)),
)


def run(
    *, data_dir: Path | None = None, bin_s: float = 30.0, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Backtest every case found under ``data_dir``; cases whose file is absent are listed as skipped."""
    root = data_dir or default_data_dir()
    results: dict[str, Any] = {}
    skipped = []
    for name, parts, horizons in CASES:
        path = root.joinpath(*parts)
        if not path.exists():
            skipped.append(name)
            continue
        began = time.perf_counter()
        report = backtest_trace(
            path,
            bin_s=bin_s,
            horizons_s=list(horizons),
            refit_every_s=3600.0,
            models=["last_value", "moving_average", "seasonal_naive", "holt_damped", "arima"],
        )
        report["wall_s"] = round(time.perf_counter() - began, 2)
        for entry in report["horizons"].values():
            ratio = entry.get("best_model_vs_best_baseline")
            entry["goal_met"] = ratio is not None and ratio <= GOAL_RATIO
        results[name] = report
        progress(f"done: {name}")
    return {
        "baseline": "best of last_value / moving_average / seasonal_naive (same origins)",
        "goal_ratio": GOAL_RATIO,
        "cases": results,
        "skipped": skipped,
    }
