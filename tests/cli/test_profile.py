"""``moeslo profile`` refuses a rate list it cannot read by the option's name, before it reaches the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S


@pytest.mark.parametrize(
    ("rates", "says"),
    [
        ("a,b", "error: --rates: 'a' is not a finite number; --rates: 'b' is not a finite number"),
        ("1,inf", "error: --rates: 'inf' is not a finite number"),
    ],
)
def test_rates_that_are_not_numbers_are_refused_by_name(rates: str, says: str) -> None:
    """It said "could not convert string to float: 'a'", and took inf as a rate."""
    from cli.main import app

    result = CliRunner().invoke(app, ["profile", "--url", "http://127.0.0.1:9", "--rates", rates])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())



def _level(rate: float, within: float) -> dict[str, Any]:
    """One level's summary as ``harness.sweep`` writes it, of a replica like the default profile's at 256/64 tokens."""
    requests = round(rate * 20)
    return {"rate_rps": rate, "requests_per_s": rate, "requests": requests, "ok": requests, "wall_s": 20.0,
            "prompt_tokens": requests * 256, "output_tokens": requests * 64, "ttft_p50_s": 0.018,
            "ttft_p99_s": 0.03, "itl_p50_s": 0.007 + 0.0001 * rate, "itl_p99_s": 0.009,
            "within_objectives": within, "token_gaps": requests * 63, "gaps_within_objective": within}


def _never() -> list[dict[str, Any]]:
    raise AssertionError("the sweep ran")


def _profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, levels: list[dict[str, Any]] | None,
             *args: str) -> tuple[Result, Path]:  # fmt: skip
    """``moeslo profile`` run through the app against a sweep that returns ``levels`` (no engine; None: a sweep
    that must not run)."""
    import httpx

    import harness.engine_limits
    import harness.sweep
    from cli.main import app

    limits = {"kv_capacity_tokens": 100_000, "max_num_seqs": 256, "prefill_chunk_tokens": 2048}
    monkeypatch.setattr(httpx, "get", lambda *_a, **_k: None)
    monkeypatch.setattr(harness.engine_limits, "profile_limits", lambda *_a, **_k: (limits, {}, ""))
    monkeypatch.setattr(harness.sweep, "sweep_rates", lambda *_a, **_k: levels if levels is not None else _never())
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["profile", "--url", "http://127.0.0.1:9", "--out", str(out),
                                      "--no-prefix-probe", "--warmup", "0", *args])  # fmt: skip
    return result, out


def test_a_sweep_whose_every_level_held_says_no_ceiling_was_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """It wrote the top swept rate as the ceiling, and the capacity model never sized a replica for more."""
    from controller.capacity import ReplicaProfile

    result, out = _profile(monkeypatch, tmp_path, [_level(rate, 1.0) for rate in (1.0, 2.0, 4.0)])
    assert result.exit_code == 0, result.output
    assert ReplicaProfile.load(out).max_request_rate_rps is None
    assert "every level held: no ceiling measured; sweep higher --rates" in " ".join(result.output.split())
    result, out = _profile(monkeypatch, tmp_path, [_level(1.0, 1.0), _level(2.0, 1.0), _level(4.0, 0.5)])
    assert result.exit_code == 0, result.output
    ceiled = ReplicaProfile.load(out)
    assert ceiled.max_request_rate_rps is not None
    assert "held the objectives up to" in result.output
    # What it was measured under, so the capacity model caps only the policies it says something of.
    assert ceiled.ceiling_measured_at is not None
    assert ceiled.ceiling_measured_at.model_dump() == {"ttft_s": TTFT_THRESHOLD_S, "itl_s": ITL_THRESHOLD_S,
                                                       "prompt_tokens": 256, "output_tokens": 64}  # fmt: skip


def test_one_output_token_is_refused_before_the_sweep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One token a request leaves no token gap to measure ITL from: the fit failed after the whole sweep."""
    result, _ = _profile(monkeypatch, tmp_path, None, "--output-tokens", "1")
    assert result.exit_code == 2, result.output
    assert "--output-tokens: must be 2 or more" in " ".join(result.output.split())
