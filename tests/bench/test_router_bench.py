"""The router benchmark runs end to end on a tiny budget and reports both figures against direct calls."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.router import RouterBenchConfig, run_router_bench
from cli.main import app

pytestmark = pytest.mark.timeout(120)


def test_the_bench_reports_overhead_and_throughput_against_direct_calls() -> None:
    cfg = RouterBenchConfig(rounds=2, requests_per_round=20, throughput_rounds=2, throughput_s=0.3, connections=4)
    figures = run_router_bench(cfg)
    overhead, rate = figures["overhead"], figures["throughput"]
    assert overhead["direct"]["requests"] == overhead["proxied"]["requests"] == 40
    assert overhead["proxied"]["p50_ms"] > overhead["direct"]["p50_ms"] > 0  # a proxy adds a hop
    assert [r["order"] for r in overhead["rounds"]] == [["direct", "proxied"], ["proxied", "direct"]]
    assert rate["proxied_requests_per_s"] > 0 and rate["direct_requests_per_s"] > 0
    assert isinstance(rate["goal_met"], bool) and isinstance(overhead["goal_met"], bool)


def test_bad_settings_are_usage_errors() -> None:
    with pytest.raises(ValueError, match="rounds"):
        RouterBenchConfig(rounds=1)
    result = CliRunner().invoke(app, ["bench", "router", "--rounds", "1", "--json"])
    assert result.exit_code == 2
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)
