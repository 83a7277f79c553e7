"""The controller creates a labelled counter at its first increment, so its first sample is already 1: the
dashboards' decision and rebalance queries must count that first one (``increase`` and ``changes`` alone do
not), checked by Prometheus's own evaluator (``promtool test rules``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.catalogue import DECISIONS, REBALANCES, total
from controller.policy_files import DEFAULT_POLICIES
from generators.dashboards import build_dashboards
from tests.generators.dashboards.test_dashboards import substitute


def _exprs(document: dict[str, Any], metric: str) -> list[str]:
    found = [t["expr"] for p in document.get("panels", []) for t in p.get("targets", []) if metric in t.get("expr", "")]
    found += [a["expr"] for a in document.get("annotations", {}).get("list", []) if metric in a.get("expr", "")]
    return [substitute(e) for e in found]


def test_a_decision_and_a_rebalance_show_from_their_first_sample(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    documents = build_dashboards(DEFAULT_POLICIES)
    decisions = _exprs(documents["moeslo-controller.json"], total(DECISIONS))
    rebalances = _exprs(documents["moeslo-experts.json"], total(REBALANCES))
    assert len(decisions) >= 2 and rebalances  # the panel and the annotation; the rebalances panel
    born = '_ _ _ _ 1 1 1 1 1 1 1 1 2 2 2 2'  # born at 60 s by its first increment, a second at 180 s
    series = {total(DECISIONS): '{policy="p", action="scale_up", reason="forecast"}',
              total(REBALANCES): '{policy="p", outcome="applied"}'}
    # Just after its birth (75 s) and just after its second increment (195 s, the plain increase's own case).
    tests = [{"expr": expr, "eval_time": at, "exp_samples": [{"labels": series[metric], "value": 1}]}
             for metric, exprs in ((total(DECISIONS), decisions), (total(REBALANCES), rebalances))
             for expr in exprs for at in ("75s", "195s")]
    (tmp_path / "none.yaml").write_text("groups: []\n")
    (tmp_path / "first.test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["none.yaml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s",
                   "input_series": [{"series": metric + labels, "values": born} for metric, labels in series.items()],
                   "promql_expr_test": tests}],
    }))
    result = subprocess.run([promtool, "test", "rules", "first.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr + json.dumps(tests, indent=1)


def test_a_failed_scrape_does_not_make_a_long_lived_series_look_new(tmp_path: Path) -> None:
    """One failed scrape writes a staleness marker: ``X offset w`` then read nothing, and the whole total (40
    decisions made long ago) showed as made within the window."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    decisions = _exprs(build_dashboards(DEFAULT_POLICIES)["moeslo-controller.json"], total(DECISIONS))
    labels = '{policy="p", action="scale_up", reason="forecast"}'
    tests = [{"expr": expr, "eval_time": at,
              "exp_samples": [{"labels": labels, "value": 0}] if "increase" in expr else []}
             for expr in decisions for at in ("675s", "685s")]  # just after the failed scrape at 615 s
    (tmp_path / "none.yaml").write_text("groups: []\n")
    (tmp_path / "stale.test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["none.yaml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": [{"series": total(DECISIONS) + labels,
                                                         "values": "40x40 stale 40x40"}],
                   "promql_expr_test": tests}],
    }))
    result = subprocess.run([promtool, "test", "rules", "stale.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
