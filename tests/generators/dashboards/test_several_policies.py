"""Dashboards built from several SLO policies: every policy is drawn with its own numbers."""

from __future__ import annotations

import re
from typing import Any

from controller.policy import LatencyObjective, LocalTarget, Objectives, Policy
from generators.dashboards import build_dashboards


def _policy(name: str, *, ttft: float = 0.99, itl: float = 0.99) -> Policy:
    return Policy(name=name, target=LocalTarget(model=f"model-{name}"), objectives=Objectives(
        ttft=LatencyObjective(threshold_s=0.5, target=ttft), itl=LatencyObjective(threshold_s=0.02, target=itl)))


def test_ref_ids_stay_letters_past_26_targets() -> None:
    """Five policies give the recorded burn-rate panel 30 targets: refIds go A..Z, AA, AB, ... (chr() gave '[')."""
    overview = build_dashboards([_policy(f"p{i}") for i in range(5)])["moeslo-slo-overview.json"]
    (panel,) = [p for p in overview["panels"] if p["title"] == "Burn rate (alert recording rules)"]
    ref_ids = [target["refId"] for target in panel["targets"]]
    assert len(ref_ids) == 30
    assert ref_ids[:3] == ["A", "B", "C"] and ref_ids[25:] == ["Z", "AA", "AB", "AC", "AD"]
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
