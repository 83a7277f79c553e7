"""The status-page benchmark runs end to end on a small fleet, and its fleet reads like a real log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from bench.status_fleet import SyntheticFleet, build_fleet
from bench.status_page import StatusPageBenchConfig, run_status_page_bench
from cli.main import app
from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store


def test_the_bench_reports_every_page_against_the_json_baseline() -> None:
    figures = run_status_page_bench(StatusPageBenchConfig(policies=8, hours=0.5, requests=2, warmup=1))
    baseline, listed = figures["baseline"], figures["results"]
    assert isinstance(baseline, dict) and isinstance(listed, list)
    assert baseline["name"] == "status_json"
    results = {r["name"]: r for r in listed}
    assert set(results) == {"overview", "policy_6h", "policy_1d", "policy_1d_cold"}
    for result in results.values():
        assert result["requests"] == 2 and result["p99_ms"] >= result["median_ms"] > 0
        assert result["server_median_ms"] > 0 and result["median_ratio_vs_baseline"] > 0
    # The cold step dropped every page's series, so policy_6h, described as a reload, timed first visits.
    assert [results[n]["full_reads"] for n in ("policy_6h", "policy_1d", "policy_1d_cold")] == [0, 0, 2]
    assert figures["decisions_logged"] == 8 * 120 + 3 * 2  # 30 min of 15 s ticks; 3 rebalances and their checks


def test_the_cli_prints_json() -> None:
    result = CliRunner().invoke(app, ["bench", "status-page", "--policies", "2", "--hours", "0.1", "--requests", "1",
                                      "--warmup", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["benchmark"] == "status_page"
    with pytest.raises(ValueError, match="requests must be >= 1"):
        StatusPageBenchConfig(requests=0)


def test_the_synthetic_fleet_renders_with_its_paging_policy_first(tmp_path: Path) -> None:
    settings = ControllerSettings(db=str(tmp_path / "c.db"))
    store = Store(settings.db_url)
    view = build_fleet(store, SyntheticFleet(policies=10, hours=1.0))
    with TestClient(create_app(settings, store, service=view)) as client:
        html = client.get("/ui/").text
        assert html.index('data-policy="policy-006"') < html.index('data-policy="policy-000"')
        page = client.get("/ui/policies/policy-006").text
        assert 'data-verdict="PAGE"' in page and 'data-chart="rebalances"' in page
    store.close()
