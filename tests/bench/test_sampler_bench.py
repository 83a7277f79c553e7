"""``moeslo bench sampler``: both samplers timed on every case, and the baseline draws as the sampler did."""

from __future__ import annotations

import json

import torch

from bench.sampler import SHAPES, WORKLOADS, SamplerBenchConfig, one_row_at_a_time, run
from engine.sampling import RequestSampler, SamplingParams, TokenHistory


def test_every_case_has_both_timings_and_their_ratio() -> None:
    result = run(SamplerBenchConfig(batch=3, vocab_sizes=(300,), rounds=2, steps=1))
    assert result["baseline"] == "one_row_at_a_time"
    assert len(result["cases"]) == len(SHAPES) * len(WORKLOADS)
    for case in result["cases"]:
        ratio = case["batched_over_one_row_at_a_time"]
        assert case["batched_ms"]["median"] > 0 and case["one_row_at_a_time_ms"]["median"] > 0
        assert ratio["min"] <= ratio["median"] <= ratio["max"]


def test_the_baseline_draws_within_each_rows_filters() -> None:
    logits = torch.arange(50.0).repeat(4, 1)
    samplers = [RequestSampler(SamplingParams(temperature=1.0, top_k=3, seed=s)) for s in range(4)]
    draws = {t for _ in range(30) for t in one_row_at_a_time(logits, samplers, [TokenHistory((), ())] * 4)}
    assert draws <= {47, 48, 49} and len(draws) > 1


def test_the_command_prints_json() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    out = CliRunner().invoke(app, ["bench", "sampler", "--json", "--batch", "2", "--vocab-size", "100",
                                   "--rounds", "1", "--steps", "1"])
    assert out.exit_code == 0, out.output
    assert {case["vocab_size"] for case in json.loads(out.stdout)["cases"]} == {100}
