"""``moeslo forecast backtest`` and ``moeslo replay`` end to end on small synthetic traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from cli.main import app
from controller.replay.settings import SWEEP_GRIDS


def write_azure(path: Path, minutes: int = 12, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / 3.0, minutes * 60 * 4))
    arrival = arrival[arrival < minutes * 60]
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    base = np.datetime64("2023-11-16T18:00:00", "us")
    for t in arrival:
        stamp = str(base + np.timedelta64(int(t * 1e6), "us")).replace("T", " ")
        lines.append(f"{stamp},{rng.integers(100, 1500)},{rng.integers(10, 300)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_forecast_backtest_json(tmp_path: Path) -> None:
    trace = write_azure(tmp_path / "t.csv")
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "backtest",
            "--trace",
            str(trace),
            "--bin",
            "10",
            "--horizon",
            "30",
            "--models",
            "last_value,moving_average,holt_damped",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    entry = report["horizons"]["30s"]
    assert set(entry["wape"]) == {"last_value", "moving_average_8", "holt_damped"}
    assert all(0 < v < 1 for v in entry["wape"].values())
    assert entry["best_baseline"] in {"last_value", "moving_average_8"}
    assert report["notes"] == []


def test_forecast_backtest_says_what_it_answers_differently(tmp_path: Path) -> None:
    """Horizons of 28 and 30 s in bins of 10 s both became one "30s" row, and seasonal naive went
    missing from the table, without a word."""
    trace = write_azure(tmp_path / "t.csv")
    args = ["forecast", "backtest", "--trace", str(trace), "--bin", "10", "--horizon", "28", "--horizon", "30",
            "--models", "last_value,seasonal_naive"]
    report = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert list(report["horizons"]) == ["30s"] and set(report["horizons"]["30s"]["wape"]) == {"last_value"}
    assert report["notes"][0] == "horizon 28 s is scored as 30 s (whole bins of 10 s)"
    assert report["notes"][1].startswith("seasonal_naive left out: the trace has under 2 days")
    printed = " ".join(CliRunner().invoke(app, args).output.split())
    assert "note: horizon 28 s is scored as 30 s" in printed and "note: seasonal_naive left out" in printed


def test_forecast_backtest_leaves_out_a_model_its_first_fit_could_not_estimate(tmp_path: Path) -> None:
    """23 bins before the test part: ARIMA estimates from 30, so it was scored as a random walk (last value's
    forecasts) under its own name."""
    trace = write_azure(tmp_path / "t.csv", minutes=8)  # 47 bins of 10 s, the last half tested
    args = ["forecast", "backtest", "--trace", str(trace), "--bin", "10", "--horizon", "30", "--models",
            "last_value,holt_damped,arima", "--json"]  # fmt: skip
    report = json.loads(CliRunner().invoke(app, args).stdout)
    assert set(report["horizons"]["30s"]["wape"]) == {"last_value", "holt_damped"}
    assert report["notes"] == ["arima left out: its first fit would take the 23 bin(s) before the test part, "
                               "and it estimates its parameters from 30"]  # fmt: skip
    for models in ("arima", "seasonal_naive,arima"):  # seasonal naive needs two days: nothing left to score
        alone = CliRunner().invoke(app, [*args[:-2], models])
        assert alone.exit_code == 2 and "can be fitted on the 23 bin(s)" in " ".join(alone.output.split())


def test_replay_writes_summary_and_plots(tmp_path: Path) -> None:
    trace = write_azure(tmp_path / "t.csv")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["replay", "--trace", str(trace), "--policies", "static,hpa:target=0.5,oracle", "--out", str(out),
         "--warmup", "120", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary["policies"]) == {"static:headroom=0.85", "hpa:scale_down_window_s=300,target=0.5",
                                       "oracle:headroom=0.85"}
    assert summary["mode"] == "request"
    assert set(summary["policies"]["hpa:scale_down_window_s=300,target=0.5"]) >= {"scored", "warmup"}
    assert json.loads((out / "summary.json").read_text())["policies"] == summary["policies"]
    assert (out / "replicas.png").stat().st_size > 1000


def test_replay_sweep_draws_frontiers_and_reads_them_at_fixed_attainments(tmp_path: Path) -> None:
    trace = write_azure(tmp_path / "t.csv")
    out = tmp_path / "sweep"
    result = CliRunner().invoke(
        app,
        ["replay", "--sweep", "--trace", str(trace), "--policies", "static,hpa,oracle", "--out", str(out),
         "--warmup", "120", "--capacity-error", "-0.2", "--workers", "1", "--window", "late=360:", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["world"]["capacity_error"] == -0.2
    assert set(summary["windows"]) == {"warmup", "scored", "late"}
    scored = summary["windows"]["scored"]
    assert set(scored["frontiers"]) == {"static", "hpa", "oracle"}
    assert set(scored["at_attainment"]) == {"99.5%", "99.8%", "99.9%"}
    assert len(summary["points"]) == sum(len(SWEEP_GRIDS[p]) for p in ("static", "hpa", "oracle"))
    assert (out / "frontier_scored.png").stat().st_size > 1000
    again = CliRunner().invoke(
        app,
        ["replay", "--sweep", "--trace", str(trace), "--policies", "static,hpa", "--out", str(tmp_path / "s2"),
         "--warmup", "120", "--workers", "1", "--tuned-from", str(out / "sweep.json"), "--json"],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert set(json.loads(again.stdout)["tuned_from"]["by_attainment"]["99.5%"]) == {"static", "hpa", "oracle"}


def test_replay_bad_trace_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:05,1,1\n2023-11-16 18:00:01,x,1\n")
    result = CliRunner().invoke(app, ["replay", "--trace", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"{bad}:3:" in result.output and "not a number" in result.output


def test_replay_sweep_needs_a_worker(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["replay", "--sweep", "--workers", "0", "--out", str(tmp_path / "o")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "--workers" in message and "greater than or equal to 1" in message
    assert not (tmp_path / "o").exists()  # refused before any work
