"""Backtest the forecasters on a trace file: the split, the seasonal period, and a JSON-able report.

``moeslo forecast backtest`` and the forecast benchmark both call
:func:`backtest_trace`.  The test part is the last whole days (two of them when
the series has four or more), else the last ``test_fraction``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contracts.errors import ValidationError
from contracts.traces import load_trace
from controller.forecast.backtest import BASELINES, MIN_FIT_BINS, BacktestResult, compare_models
from controller.forecast.history import bins_covering
from controller.forecast.models import FloatArray
from controller.forecast.series import request_counts

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Split:
    """Where the test part of a series starts, and the daily period when there is history for it."""

    start: int
    description: str
    period: int | None


def split_series(bins: int, bin_s: float, test_fraction: float | None) -> Split:
    """The last 2 days when the series has 4 or more (and no fraction is asked for), else the last share."""
    day_bins = round(DAY_S / bin_s)
    if test_fraction is None and bins * bin_s >= 4 * DAY_S:
        start, description = bins - 2 * day_bins, "last 2 days"
    else:
        fraction = test_fraction if test_fraction is not None else 0.5
        start, description = int(bins * (1 - fraction)), f"last {fraction:.0%}"
    return Split(start, description, day_bins if start >= 2 * day_bins else None)


def horizon_report(results: Sequence[BacktestResult], steps: Sequence[int], bin_s: float) -> dict[str, Any]:
    """Per horizon: every model's WAPE and the best model against the best baseline."""
    by_horizon: dict[str, Any] = {}
    for h in steps:
        # WAPE is undefined (None) where the test part has no requests: no model is best there.
        defined = [r for r in results if math.isfinite(r.wape_by_horizon[h])]
        defined_ids = {id(r) for r in defined}  # by identity: results compare numpy arrays field by field
        scores = {r.name: round(r.wape_by_horizon[h], 5) if id(r) in defined_ids else None for r in results}
        baselines = {r.name: r.wape_by_horizon[h] for r in defined if r.kind in BASELINES}
        models_only = {r.name: r.wape_by_horizon[h] for r in defined if r.kind not in BASELINES}
        entry: dict[str, Any] = {"horizon_s": h * bin_s, "wape": scores}
        if baselines and models_only:
            best_baseline = min(baselines, key=lambda k: baselines[k])
            best_model = min(models_only, key=lambda k: models_only[k])
            entry["best_baseline"] = best_baseline
            entry["best_model"] = best_model
            best = baselines[best_baseline]  # a perfect baseline leaves no ratio
            entry["best_model_vs_best_baseline"] = round(models_only[best_model] / best, 4) if best > 0 else None
        by_horizon[f"{h * bin_s:g}s"] = entry
    return by_horizon


def backtest_notes(horizons_s: Sequence[float], bin_s: float, models: Sequence[str], split: Split) -> list[str]:
    """What the report answers differently from what was asked: horizons scored in the whole bins that cover them
    (two that need the same bins merge), and seasonal naive without two days of history to repeat."""
    notes = []
    for h in sorted(set(horizons_s)):
        scored = bins_covering(h, bin_s) * bin_s  # as the controller's forecasts cover it
        if abs(scored - h) > 1e-9 * max(1.0, h):
            notes.append(f"horizon {h:g} s is scored as {scored:g} s (whole bins of {bin_s:g} s)")
    if "seasonal_naive" in models and split.period is None:
        notes.append(f"seasonal_naive left out: the trace has under 2 days before its test part ({split.description})")
    for kind in models:
        if split.start < MIN_FIT_BINS.get(kind, 1):  # scored unfitted, it would be another model under its name
            notes.append(f"{kind} left out: its first fit would take the {split.start} bin(s) before the test part, "
                         f"and it estimates its parameters from {MIN_FIT_BINS[kind]}")
    return notes


def backtest_trace(
    trace_path: Path,
    *,
    bin_s: float,
    horizons_s: Sequence[float],
    refit_every_s: float,
    models: Sequence[str],
    test_fraction: float | None = None,
    on_model_done: Callable[[BacktestResult], None] | None = None,
) -> dict[str, Any]:
    """Backtest ``models`` on the request counts of a trace; a JSON-able report."""
    series: FloatArray = request_counts(load_trace(trace_path), bin_s)
    steps = sorted({bins_covering(h, bin_s) for h in horizons_s})
    split = split_series(len(series), bin_s, test_fraction)
    if split.start < 1 or len(series) - max(steps) < split.start:
        raise ValidationError(
            f"{trace_path} spans {len(series)} bins of {bin_s:g} s: too short to test a {max(steps) * bin_s:g} s "
            f"horizon after {split.start} bin(s) of history ({split.description}); use a longer trace, a "
            "shorter --bin or --horizon"
        )
    refit_every = max(1, round(refit_every_s / bin_s))
    fitted = [kind for kind in models if split.start >= MIN_FIT_BINS.get(kind, 1)
              and (kind != "seasonal_naive" or split.period is not None)]  # fmt: skip
    if not fitted:
        raise ValidationError(f"{trace_path}: none of --models {','.join(models)} can be fitted on the "
                              f"{split.start} bin(s) before the test part (see the notes of a longer trace); use "
                              "a longer trace, a shorter --bin, or other models")
    results = compare_models(
        series, fitted, period=split.period, horizons=steps, start=split.start, refit_every=refit_every,
        history_bins=len(series) if split.period is not None else 720, on_model_done=on_model_done,
    )
    notes = backtest_notes(horizons_s, bin_s, models, split)
    if not series[split.start :].any():
        notes.append(f"the test part ({split.description}) has no requests: WAPE is undefined (null)")
    return {
        "notes": notes,
        "trace": str(trace_path),
        "bin_s": bin_s,
        "bins": len(series),
        "mean_per_bin": round(float(np.mean(series)), 3),
        "test": split.description,
        "origins": len(results[0].origins) if results else 0,
        "seasonal_period_bins": split.period,
        "refit_every_bins": refit_every,
        "fit_seconds": {r.name: round(r.fit_seconds, 2) for r in results},
        "horizons": horizon_report(results, steps, bin_s),
    }


__all__ = ["DAY_S", "Split", "backtest_notes", "backtest_trace", "horizon_report", "split_series"]
