"""Dashboards as code: drift, structure, and every PromQL expression parsed by a real Prometheus."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from contracts.errors import ValidationError
from controller.policy import LatencyObjective, LocalTarget, Objectives, Policy
from controller.policy_files import DEFAULT_POLICIES
from generators.alerts.model import RecordingRule
from generators.alerts.rules import build_rule_groups
from generators.dashboards import build_dashboards, expressions, render_dashboard_files
from tests.e2e.servers import prometheus

ROOT = Path(__file__).resolve().parents[3]

# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "30s", "$model": ".*", "$policy": ".*"}


def substitute(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def test_committed_dashboards_match_the_generator() -> None:
    files = render_dashboard_files(DEFAULT_POLICIES)
    assert sorted(files) == sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    for name, text in files.items():
        assert (ROOT / "dashboards" / name).read_text(encoding="utf-8") == text, f"{name} drifted"


def test_dashboards_have_variables_slo_lines_and_decision_annotations() -> None:
    documents = build_dashboards(DEFAULT_POLICIES)
    assert set(documents) == {"moeslo-slo-overview.json", "moeslo-engine.json", "moeslo-experts.json",
                              "moeslo-controller.json"}
    for document in documents.values():
        names = [v["name"] for v in document["templating"]["list"]]
        assert names[:2] == ["datasource", "model"]
        assert document["schemaVersion"] == 36 and "grafana-10.1" in document["tags"]
        panels = [p for p in document["panels"] if p["type"] != "row"]
        assert len({p["id"] for p in document["panels"]}) == len(document["panels"])
        assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in panels)
    overview = documents["moeslo-slo-overview.json"]
    lines = {p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])]
             for p in overview["panels"] if p["type"] == "timeseries"}
    assert lines["TTFT p50 / p90 / p99 (SLO 0.5 s)"] == [None, 0.5]
    assert lines["ITL p50 / p90 / p99 (SLO 0.02 s)"] == [None, 0.02]
    assert "policy" in [v["name"] for v in documents["moeslo-controller.json"]["templating"]["list"]]
    (annotation,) = documents["moeslo-controller.json"]["annotations"]["list"]
    assert "moeslo_decisions_total" in annotation["expr"] and annotation["textFormat"] == "{{reason}}"
    experts = {p["type"] for p in documents["moeslo-experts.json"]["panels"]}
    assert {"heatmap", "table", "timeseries"} <= experts


def test_the_imbalance_panel_draws_what_the_alert_judges() -> None:
    """The ticket fires on the CV with the window's sampling noise taken out: the panel drew the raw CV, which a
    quiet engine holds above the SLO line from noise alone."""
    experts = build_dashboards(DEFAULT_POLICIES)["moeslo-experts.json"]
    (panel,) = [p for p in experts["panels"] if p["title"].startswith("Imbalance CV per layer")]
    exprs = [target["expr"] for target in panel["targets"]]
    assert "sqrt(clamp_min((moe_layer_imbalance_cv{" in exprs[0] and "moe_layer_imbalance_cv_noise_floor{" in exprs[0]
    assert exprs[1].startswith("max by (model_name) (moe_layer_imbalance_cv_noise_floor{")


def test_slo_lines_follow_the_policy() -> None:
    policy = Policy(name="fast", target=LocalTarget(model="m"), objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.25, target=0.995), itl=LatencyObjective(threshold_s=0.05, target=0.99)))
    overview = build_dashboards([policy])["moeslo-slo-overview.json"]
    exprs = [e for _, e in expressions(overview)]
    assert any('le="0.25"' in e for e in exprs) and any('le="0.05"' in e for e in exprs)
    assert any(e.endswith("/ 0.005") for e in exprs)
    with pytest.raises(ValidationError):
        build_dashboards([])


def test_the_engine_dashboard_shows_each_replicas_step_times() -> None:
    """The runbooks send an on-call to the Engine dashboard's step times: a hung replica's line stops."""
    (panel,) = [p for p in build_dashboards(DEFAULT_POLICIES)["moeslo-engine.json"]["panels"]
                if p["title"] == "Engine step time p50 / p99"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert [e.split("(")[1].split(",")[0] for e in exprs] == ["0.5", "0.99"]
    assert all("sum by (le, instance, engine) (rate(moeslo_engine_step_duration_seconds_bucket{" in e for e in exprs)


def test_each_slo_uses_its_own_budget_and_target() -> None:
    """TTFT at 0.995 (budget 0.005) and ITL at 0.99 (budget 0.01): neither borrows the other's numbers."""
    policy = Policy(name="mixed", target=LocalTarget(model="m"), window="7d", objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.5, target=0.995), itl=LatencyObjective(threshold_s=0.02, target=0.99)))
    documents = build_dashboards([policy])

    def panel_exprs(document: str, title: str) -> list[str]:
        (panel,) = [p for p in documents[document]["panels"] if p["title"] == title]
        return [t["expr"] for t in panel["targets"]]

    burn = panel_exprs("moeslo-slo-overview.json", "Burn rate (alert recording rules)")
    for window in ("5m", "30m", "1h", "6h", "3d"):  # 7 days: 1h/5m, 6h/30m and 3d/6h alert
        assert f'moeslo:slo_error_ratio:rate{window}{{policy=~"$policy",policy="mixed",slo="ttft"}} / 0.005' in burn
        assert f'moeslo:slo_error_ratio:rate{window}{{policy=~"$policy",policy="mixed",slo="itl"}} / 0.01' in burn
    assert len(burn) == 10
    good = panel_exprs("moeslo-slo-overview.json", "Good-event ratio")
    assert "vector(0.995)" in good and "vector(0.99)" in good
    seen = panel_exprs("moeslo-controller.json", "SLIs the controller sees: good ratios")
    assert "vector(0.995)" in seen and "vector(0.99)" in seen
    # A window too short for any burn-rate alert still builds (its line is the 1x pace).
    assert build_dashboards([policy.model_copy(update={"window": "1d"})])


@pytest.mark.parametrize("several", [False, True])
def test_the_good_ratio_panel_divides_by_the_rules_total(several: bool) -> None:
    """The panel divided by the histogram's count alone, while the rules (and the controller) count the requests
    the engines ended before a first token too: 48 good of 60 requests read 100 % on the panel, 80 % in the
    alerts."""
    policies = [Policy(name=n, target=LocalTarget(model=n)) for n in ("a", "b")[: 1 + several]]
    (rules,) = build_rule_groups(policies[:1])
    totals = {(r.labels["slo"]): r.expr for r in rules.rules
              if isinstance(r, RecordingRule) and r.record == "moeslo:slo_total_events:rate5m"}  # fmt: skip
    prefix = "a: " if several else ""
    (panel,) = [p for p in build_dashboards(policies)["moeslo-slo-overview.json"]["panels"]
                if p["title"] == f"{prefix}Good-event ratio"]  # fmt: skip
    drawn = [t["expr"] for t in panel["targets"][:2]]
    for slo, expr in zip(("ttft", "itl"), drawn, strict=True):
        # Grafana's $model, alone or beside the policy's own model matcher, reads as the rules' model_name="a"
        model = ('model_name=~"$model",', "") if several else ('model_name=~"$model"', 'model_name="a"')
        denominator = expr.split(" / ", 1)[1].replace("$__rate_interval", "5m").replace(*model)
        assert denominator == f"sum({totals[slo]})"
    assert "moeslo_requests_without_first_token_total{" in drawn[0]


@pytest.mark.parametrize("window", ["50h", "7d", "30d"])
def test_the_recorded_burn_rates_are_the_windows_the_rules_record(window: str) -> None:
    """The panel queried 5m, 1h and 6h whatever the policy: a 50-hour policy's rules record 5m, 1h, 2h and 1d (its
    alerts are 1h/5m and 1d/2h), so its 6h line stayed empty and its 1d/2h ticket went undrawn."""
    policy = Policy(name="p", target=LocalTarget(model="m"), window=window)
    recorded = {rule.record for group in build_rule_groups([policy]) for rule in group.rules
                if isinstance(rule, RecordingRule) and rule.record.startswith("moeslo:slo_error_ratio:")}
    (panel,) = [p for p in build_dashboards([policy])["moeslo-slo-overview.json"]["panels"]
                if p["title"] == "Burn rate (alert recording rules)"]
    drawn = {t["expr"].split("{")[0] for t in panel["targets"]}
    assert drawn == recorded
    assert len(panel["targets"]) == 2 * len(recorded)  # TTFT and ITL each


def test_each_policy_burns_its_own_budget_on_promtool(tmp_path: Path) -> None:
    """Two policies with different targets and the same error ratio: the one at 99.9 % burns 10x faster than the
    one at 99 %.  The panel divided every policy's ratio by the first policy's budget (both read 1x)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")

    def policy(name: str, ttft: float, itl: float) -> Policy:
        return Policy(name=name, target=LocalTarget(model=name), objectives=Objectives(
            ttft=LatencyObjective(threshold_s=0.5, target=ttft), itl=LatencyObjective(threshold_s=0.02, target=itl)))

    overview = build_dashboards([policy("loose", 0.99, 0.99), policy("strict", 0.999, 0.995)])
    (panel,) = [p for p in overview["moeslo-slo-overview.json"]["panels"]
                if p["title"] == "Burn rate (alert recording rules)"]
    exprs = [substitute(t["expr"]) for t in panel["targets"] if "rate5m" in t["expr"]]
    series = [{"series": f'moeslo:slo_error_ratio:rate5m{{policy="{name}",slo="{slo}"}}', "values": "0.01x5"}
              for name in ("loose", "strict") for slo in ("ttft", "itl")]
    expected = {("loose", "ttft"): 1, ("loose", "itl"): 1, ("strict", "ttft"): 10, ("strict", "itl"): 2}
    checks = [{"expr": f"sum by (policy, slo) ({' or '.join(f'({e})' for e in exprs)})", "eval_time": "2m",
               "exp_samples": [{"labels": f'{{policy="{name}",slo="{slo}"}}', "value": value}
                               for (name, slo), value in expected.items()]}]
    test_file = tmp_path / "burn.test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": checks}]}))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(exprs) == 4  # one query per policy and SLO


def _all_queries() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for name, document in build_dashboards(DEFAULT_POLICIES).items():
        found += [(f"{name}: {where}", expr) for where, expr in expressions(document)]
    return found


def _variable_queries() -> list[tuple[str, str, str]]:
    found = []
    for name, document in build_dashboards(DEFAULT_POLICIES).items():
        for variable in document["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((\S+), (\w+)\)", variable["query"])
                assert match, variable["query"]
                found.append((f"{name}: ${variable['name']}", match.group(1), match.group(2)))
    return found


@pytest.mark.integration
def test_every_panel_query_parses_on_a_real_prometheus(tmp_path: Path) -> None:
    queries = _all_queries()
    assert len(queries) > 40
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    with prometheus(tmp_path, config) as url, httpx.Client(base_url=url, timeout=10) as client:
        failures: list[str] = []
        for where, expr in queries:
            body: dict[str, Any] = client.get("/api/v1/query", params={"query": substitute(expr)}).json()
            if body["status"] != "success":
                failures.append(f"{where}: {body.get('error')}")
        for where, metric, label in _variable_queries():
            response = client.get(f"/api/v1/label/{label}/values", params={"match[]": metric})
            if response.json()["status"] != "success":
                failures.append(f"{where}: {response.text}")
        assert failures == []
        # The check can fail: a broken expression is reported as bad_data.
        broken = client.get("/api/v1/query", params={"query": "sum by (le (rate(x[1m]))"}).json()
        assert broken["status"] == "error" and broken["errorType"] == "bad_data"


def test_committed_json_decodes_with_the_sdk_models() -> None:
    import json

    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        document = json.loads(path.read_text())
        model = Dashboard.from_json(document)
        assert model.uid == document["uid"]
        assert len(model.panels or []) == len(document["panels"])
