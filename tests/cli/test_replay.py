"""``moeslo replay``: an empty scored window is refused before any run, on every path; options refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.controller.replay.test_cli import write_azure

BUNDLED = Path(__file__).resolve().parents[2] / "harness" / "data" / "AzureLLMInferenceTrace_conv_15min.csv"


def invoke(*args: str) -> Result:
    from cli.main import app

    return CliRunner().invoke(app, ["replay", *args])


def refusal(result: Result) -> str:
    """The one line of a refusal (exit 2, no traceback), out of typer's box if in one."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    return " ".join(result.output.replace("│", " ").split())


def never(*args: object, **kwargs: object) -> None:
    raise AssertionError("a setting ran on a trace with nothing to score")


@pytest.mark.parametrize(
    "args",
    [
        ("--router", "cost,round-robin", "--replicas", "1,2"),
        ("--policies", "static", "--sweep", "--workers", "1"),
        ("--policies", "static"),
    ],
)
def test_an_empty_scored_window_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """--router and --sweep ended with status 0 and empty results (routers.json with NaN); a plain replay
    refused only after running every policy."""
    for where in ("controller.replay.protocol.run_setting", "controller.replay.protocol.run_sweep",
                  "bench.router_replay._run"):  # fmt: skip
        monkeypatch.setattr(where, never)
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    said = refusal(invoke("--trace", str(trace), "--out", str(tmp_path / "o"), *args))
    assert "error: no request in the scored window: the trace has no request from --start + --warmup (1800 s)" in said
    assert not [p.name for p in (tmp_path / "o").iterdir()]  # no routers.json, no sweep.json, no summary.json


def test_the_bundled_slice_names_its_span_and_a_warmup_that_scores(tmp_path: Path) -> None:
    """With the default 30-minute warm-up the 15-minute slice ran 7 policies for 18 s, then refused."""
    said = refusal(invoke("--trace", str(BUNDLED), "--out", str(tmp_path / "a")))
    assert "the part replayed spans 900 s; give a --warmup of at most 885 s" in said
    found = re.search(r"--warmup of at most (\d+) s", said)
    assert found is not None
    result = invoke("--trace", str(BUNDLED), "--out", str(tmp_path / "b"), "--policies", "static",
                    "--warmup", found[1], "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    (static,) = json.loads(result.stdout)["policies"].values()
    assert static["scored"]["requests"] > 0 and static["scored"]["attainment_both"] is not None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--ttft-per-1k", "nan"), "Invalid value for '--ttft-per-1k': must be a finite number of 0 or more, got nan"),
        (("--ttft-per-1k", "0.1234567"), "Invalid value for '--ttft-per-1k': at most 6 significant digits (its "
                                          "series label reads 0.123457), got 0.1234567"),
        (("--ttft-reference-tokens", "-1"), "Invalid value for '--ttft-reference-tokens': Input should be greater "
                                             "than or equal to 0"),
        (("--ttft-reference-tokens", "10000001"), "Invalid value for '--ttft-reference-tokens': Input should be less "
                                                  "than or equal to 10000000"),  # a policy's bound
        (("--drift-per-day", "inf"), "Invalid value for '--drift-per-day': must be a number in (-1, 10), got inf"),
        (("--drift-per-day", "-1"), "Invalid value for '--drift-per-day': must be a number in (-1, 10), got -1.0"),
        (("--capacity-error", "inf"), "Invalid value for '--capacity-error': must be a finite number of -0.9 or more "
                                      "and at most 10, got inf"),
        (("--startup-jitter", "nan"), "Invalid value for '--startup-jitter': must be a number in [0, 1), got nan"),
        (("--startup-jitter", "1"), "Invalid value for '--startup-jitter': must be a number in [0, 1), got 1.0"),
        (("--router", "cost", "--replicas", "x,2,1.5"),
         "error: --replicas: 'x' is not an integer; --replicas: '1.5' is not an integer"),
    ],
)
def test_options_are_refused_by_their_name(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    """They named the world's fields (per_1k_prompt_tokens_s, drift_per_day) or int()'s message."""
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    said = refusal(invoke("--trace", str(trace), "--out", str(tmp_path / "o"), *args))
    assert says in said
    assert "MOESLO_DEBUG" not in said


def test_a_reference_length_of_0_is_taken_as_a_policy_takes_it(tmp_path: Path) -> None:
    """A policy's objective may state its threshold at 0 prompt tokens (every token earns the allowance); the
    replay refused that objective (1 or more) and so could not replay it."""
    trace = write_azure(tmp_path / "t.csv", minutes=2)
    said = refusal(invoke("--trace", str(trace), "--out", str(tmp_path / "o"), "--policies", "static",
                          "--ttft-reference-tokens", "0", "--ttft-per-1k", "0.05"))  # fmt: skip
    assert "--ttft-reference-tokens" not in said and "error: no request in the scored window" in said
