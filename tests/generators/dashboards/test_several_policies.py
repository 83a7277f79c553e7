"""Dashboards built from several SLO policies: every policy is drawn with its own numbers."""

from __future__ import annotations

import re

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
