"""docs/metrics.md is the metric-name contract: every router series and label value is there."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from router.metrics import OUTCOMES, RouterMetrics

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
REASONS = ("next_in_turn", "fewest_outstanding", "lowest_predicted_ttft", "avoids_itl_risk", "prefix_owner",
           "prefix_owner_full", "no_prefix", "all_over_budget", "no_healthy_replica")  # fmt: skip


def test_every_router_series_is_documented() -> None:
    registry = CollectorRegistry()
    RouterMetrics(registry, ["http://a:1"])
    names = {family.name for family in registry.collect()}
    assert names and all(name.startswith("moeslo_router_") for name in names)
    missing = [n for n in names if f"`{n}`" not in DOCS and f"`{n}_total`" not in DOCS]
    assert not missing, f"not in docs/metrics.md: {missing}"


def test_every_outcome_and_reason_is_documented() -> None:
    missing = [v for v in (*OUTCOMES, *REASONS) if f"`{v}`" not in DOCS]
    assert not missing, missing


def test_the_reasons_listed_are_the_policies_reasons() -> None:
    source = (Path(__file__).resolve().parents[2] / "router" / "policies.py").read_text()
    assert all(f'"{reason}"' in source for reason in REASONS)
