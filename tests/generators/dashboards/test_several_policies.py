"""Dashboards built from several SLO policies: every policy is drawn with its own numbers."""

from __future__ import annotations

import codecs
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controller.policy import ImbalanceObjective, LatencyObjective, LocalTarget, Objectives, Policy, TtftObjective
from generators.dashboards import build_dashboards, expressions
from tests.e2e.servers import prometheus
from tests.generators.dashboards.test_dashboards import substitute


def _policy(name: str, *, ttft: float = 0.99, itl: float = 0.99) -> Policy:
    return Policy(name=name, target=LocalTarget(model=f"model-{name}"), objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.5, target=ttft), itl=LatencyObjective(threshold_s=0.02, target=itl)))


def test_ref_ids_stay_letters_past_26_targets() -> None:
    """Five policies give the recorded burn-rate panel 70 targets (two SLOs, seven windows recorded for 30 days):
    refIds go A..Z, AA, AB, ... (chr() gave '[')."""
    overview = build_dashboards([_policy(f"p{i}") for i in range(5)])["moeslo-slo-overview.json"]
    (panel,) = [p for p in overview["panels"] if p["title"] == "Burn rate (alert recording rules)"]
    ref_ids = [target["refId"] for target in panel["targets"]]
    assert len(ref_ids) == 70
    assert ref_ids[:3] == ["A", "B", "C"] and ref_ids[25:30] == ["Z", "AA", "AB", "AC", "AD"] and ref_ids[-1] == "BR"
    for document in build_dashboards([_policy(f"p{i}") for i in range(5)]).values():
        for p in document["panels"]:
            ids = [target["refId"] for target in p.get("targets", [])]
            assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Z]+", i) for i in ids), p["title"]


def _panels(document: dict[str, Any], title_start: str) -> list[dict[str, Any]]:
    return [p for p in document["panels"] if p["title"].startswith(title_start)]


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def test_each_policy_has_its_own_good_ratio_panel_and_target_lines() -> None:
    """A loose (99 %) and a strict (99.9 % / 99.5 %) policy: each good ratio is drawn against its own targets;
    the panel drew the first policy's ratio and lines only."""
    overview = build_dashboards([_policy("loose"), _policy("strict", ttft=0.999, itl=0.995)])[
        "moeslo-slo-overview.json"]
    panels = {p["title"]: _exprs(p) for p in _panels(overview, "loose: Good-event ratio")
              + _panels(overview, "strict: Good-event ratio")}
    assert sorted(panels) == ["loose: Good-event ratio", "strict: Good-event ratio"]
    loose, strict = panels["loose: Good-event ratio"], panels["strict: Good-event ratio"]
    assert [e for e in loose if e.startswith("vector(")] == ["vector(0.99)", "vector(0.99)"]
    assert [e for e in strict if e.startswith("vector(")] == ["vector(0.999)", "vector(0.995)"]
    assert all('model_name="model-loose"' in e for e in loose if not e.startswith("vector("))
    assert all('model_name="model-strict"' in e for e in strict if not e.startswith("vector("))


def test_each_policy_has_its_own_latency_slo_lines() -> None:
    """Thresholds of 0.25 s and 0.5 s: each policy's quantiles, on its own model, under its own dashed line."""
    fast = Policy(name="fast", target=LocalTarget(model="m-fast"), objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.25, target=0.99), itl=LatencyObjective(threshold_s=0.05, target=0.99)))
    overview = build_dashboards([fast, _policy("slow")])["moeslo-slo-overview.json"]
    lines = {p["title"]: (p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"], _exprs(p))
             for p in _panels(overview, "fast: ") + _panels(overview, "slow: ") if "p50 / p90 / p99" in p["title"]}
    assert {title: line for title, (line, _) in lines.items()} == {
        "fast: TTFT p50 / p90 / p99 (SLO 0.25 s)": 0.25, "fast: ITL p50 / p90 / p99 (SLO 0.05 s)": 0.05,
        "slow: TTFT p50 / p90 / p99 (SLO 0.5 s)": 0.5, "slow: ITL p50 / p90 / p99 (SLO 0.02 s)": 0.02}
    for title, (_, exprs) in lines.items():
        model = "m-fast" if title.startswith("fast") else "model-slow"
        assert all(f'model_name="{model}"' in e for e in exprs), title


def _imbalance(name: str, max_cv: float, *, lead_time_s: int = 120) -> Policy:
    return Policy(name=name, target=LocalTarget(model=f"model-{name}"), lead_time_s=lead_time_s,
                  objectives=Objectives(imbalance=ImbalanceObjective(max_cv=max_cv)))


def test_experts_draw_each_models_imbalance_slo() -> None:
    """Two models held to CV 0.15 and 0.3: the CV is shown per model, with a line per model at its own max_cv
    (the panel drew the first policy's 0.15 for both and took the max over both models' layers)."""
    experts = build_dashboards([_imbalance("a", 0.15), _imbalance("b", 0.3)])["moeslo-experts.json"]
    (panel,) = _panels(experts, "Imbalance CV per layer")
    exprs = _exprs(panel)
    assert exprs[0].startswith("max by (model_name, layer) (")
    lines = [e for e in exprs if e.startswith("vector(")]
    assert lines == ['vector(0.15) and on () count(moe_layer_imbalance_cv{model_name=~"$model",model_name="model-a"})',
                     'vector(0.3) and on () count(moe_layer_imbalance_cv{model_name=~"$model",model_name="model-b"})']
    assert "thresholds" not in panel["fieldConfig"]["defaults"]  # no single dashed line for both
    assert "0.15 (model-a)" in experts["description"] and "0.3 (model-b)" in experts["description"]
    # One shared max_cv keeps the dashed line.
    shared = build_dashboards([_imbalance("a", 0.2), _imbalance("b", 0.2)])["moeslo-experts.json"]
    (panel,) = _panels(shared, "Imbalance CV per layer")
    assert panel["title"].endswith("(SLO 0.2)") and panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1][
        "value"] == 0.2


def test_controller_shifts_each_forecast_by_its_own_lead_time() -> None:
    """Lead times of 60 s and 300 s: each policy's forecast is shifted by its own (all were shifted by 60 s)."""
    controller = build_dashboards([_imbalance("a", 0.15, lead_time_s=60), _imbalance("b", 0.15, lead_time_s=300)])[
        "moeslo-controller.json"]
    (panel,) = _panels(controller, "Forecast (made ")
    exprs = _exprs(panel)
    assert 'moeslo_forecast_requests_per_second{policy=~"$policy",policy=~"a",bound="point"} offset 60s' in exprs
    assert 'moeslo_forecast_requests_per_second{policy=~"$policy",policy=~"b",bound="point"} offset 300s' in exprs
    assert exprs[0] == 'sum by (model_name) (rate(vllm:request_success_total{model_name=~"$model"}[$__rate_interval]))'


def test_controller_draws_each_policys_good_ratio_targets() -> None:
    controller = build_dashboards([_policy("loose"), _policy("strict", ttft=0.999, itl=0.995)])[
        "moeslo-controller.json"]
    (panel,) = _panels(controller, "SLIs the controller sees: good ratios")
    legends = {t["legendFormat"]: t["expr"] for t in panel["targets"] if t["expr"].startswith("vector(")}
    assert legends == {"TTFT target 0.99 (loose)": "vector(0.99)", "TTFT target 0.999 (strict)": "vector(0.999)",
                       "ITL target 0.99 (loose)": "vector(0.99)", "ITL target 0.995 (strict)": "vector(0.995)"}


@pytest.mark.integration
def test_every_query_of_several_policies_parses_on_a_real_prometheus(tmp_path: Path) -> None:
    """Per-policy queries add matchers, offsets and constant lines: all of them must still be valid PromQL,
    a model name with a quote and a backslash and a length-normalized TTFT included."""
    odd = Policy(name="odd", target=LocalTarget(model='we"ird\\model'), lead_time_s=30, objectives=Objectives(
        ttft=TtftObjective(threshold_s=0.25, target=0.995, per_1k_prompt_tokens_s=0.1),
        imbalance=ImbalanceObjective(max_cv=0.3)))
    documents = build_dashboards([_policy("loose"), _policy("strict", ttft=0.999, itl=0.995), odd])
    queries = [(f"{name}: {where}", expr) for name, document in documents.items()
               for where, expr in expressions(document)]
    assert any('model_name="we\\"ird\\\\model"' in expr for _, expr in queries)
    with prometheus(tmp_path, {"global": {"scrape_interval": "15s"}, "scrape_configs": []}) as url, \
            httpx.Client(base_url=url, timeout=10) as client:
        failures = [f"{where}: {body.get('error')}" for where, expr in queries
                    if (body := client.get("/api/v1/query", params={"query": substitute(expr)}).json())["status"]
                    != "success"]
    assert failures == []


# Grafana's variableRegex (public/app/features/variables/utils.ts), which it runs over every query before sending
# it: known variables are replaced wherever they stand, inside PromQL string literals too; unknown ones are left.
_GRAFANA_VARIABLE = re.compile(r"\$(\w+)|\[\[([\s\S]+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::(\w+))?\}")
_GRAFANA_VALUES = {"model": ".*", "policy": ".*", "datasource": "prom", "__rate_interval": "1m", "__range": "1h",
                   "__interval": "30s", "__all": ".*"}
_EXACT_MODEL = re.compile(r'model_name="((?:[^"\\]|\\.)*)"')
_ODD_MODEL = 'ns$model[[policy]]${__range}$__rate_interval"q\\'


def grafana_interpolate(expr: str) -> str:
    """``expr`` as Grafana sends it to Prometheus with every variable set to All."""
    def value(match: re.Match[str]) -> str:
        return _GRAFANA_VALUES.get(match.group(1) or match.group(2) or match.group(4), match.group(0))
    return _GRAFANA_VARIABLE.sub(value, expr)


def test_grafana_leaves_a_model_name_with_variable_syntax_alone() -> None:
    """A model named with ``$model``, ``[[policy]]`` and ``${__range}`` in it: its row's exact matchers reach
    Prometheus as written and decode to the name (Grafana rewrote ``ns$model`` to ``ns.*``: no data)."""
    odd = Policy(name="odd", target=LocalTarget(model=_ODD_MODEL))
    literals: list[str] = []
    for document in build_dashboards([_policy("loose"), odd, _imbalance("cv", 0.3)]).values():
        for where, expr in expressions(document):
            sent = grafana_interpolate(expr)
            assert _EXACT_MODEL.findall(sent) == _EXACT_MODEL.findall(expr), where
            literals += _EXACT_MODEL.findall(expr)
    odd_literals = [text for text in literals if codecs.decode(text, "unicode_escape") == _ODD_MODEL]
    assert len(odd_literals) >= 7  # TTFT and ITL quantiles (3 each), good ratios, the experts' CV line
    assert all("$" not in text and "[" not in text for text in odd_literals)


def test_an_escaped_model_name_selects_its_series_on_promtool(tmp_path: Path) -> None:
    """The odd model's ITL good ratio, as Grafana sends it, evaluated by promtool over that model's series."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    odd = Policy(name="odd", target=LocalTarget(model=_ODD_MODEL))
    overview = build_dashboards([_policy("loose"), odd])["moeslo-slo-overview.json"]
    (panel,) = _panels(overview, "odd: Good-event ratio")
    (expr,) = [grafana_interpolate(e) for e in _exprs(panel) if "inter_token" in e]
    name = _ODD_MODEL.replace("\\", "\\\\").replace('"', '\\"')  # the series notation's own quoting
    series = [{"series": f'vllm:inter_token_latency_seconds_bucket{{model_name="{name}",le="0.02"}}',
               "values": "0+9x5"},
              {"series": f'vllm:inter_token_latency_seconds_count{{model_name="{name}"}}', "values": "0+10x5"}]
    test_file = tmp_path / "odd.test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series,
         "promql_expr_test": [{"expr": expr, "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": 0.9}]}]}]}))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, expr + "\n" + result.stdout + result.stderr


def test_each_policys_thresholds_are_checked_against_its_own_engine_and_each_target_is_described() -> None:
    from contracts.errors import ValidationError
    from generators.buckets import vllm_engine
    from generators.manifests.generated import dashboard_configmaps

    odd = Policy(name="odd", target=LocalTarget(model="model-odd"), objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.5, target=0.999), itl=LatencyObjective(threshold_s=0.03, target=0.95)))
    engine = vllm_engine({"inter_token_latency": (0.01, 0.02, 0.03, 0.05)})  # vLLM's own flag's edges
    with pytest.raises(ValidationError, match=r"threshold_s = 0\.03 is not a bucket edge"):
        build_dashboards([odd])  # moeslo's ITL edges have no 0.03
    maps = dashboard_configmaps([odd], {"odd": engine})  # the deploy renderer's path: the overlay's engine
    assert len(maps) == 4
    overview = build_dashboards([odd], {"odd": engine})["moeslo-slo-overview.json"]
    assert overview["description"].startswith("TTFT <= 0.5 s for 99.9% of requests and ITL <= 0.03 s for 95% over")
