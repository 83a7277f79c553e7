"""Dashboards as Grafana JSON files (pure: policies in, file texts out)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.errors import ValidationError
from controller.policy import Policy
from generators.buckets import EngineBuckets, EngineName, check_thresholds
from generators.dashboards.controller_view import build as controller_dashboard
from generators.dashboards.engine import build as engine_dashboard
from generators.dashboards.experts import build as experts_dashboard
from generators.dashboards.panels import GRAFANA_VERSION, to_json_dict
from generators.dashboards.slo_overview import build as slo_overview_dashboard


def build_dashboards(
    policies: Sequence[Policy], engine: EngineName | EngineBuckets | Mapping[str, EngineBuckets] = "moeslo"
) -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON; every policy's SLO lines, targets and budget are drawn as its own.

    The good-ratio panels read the bucket at each threshold, so thresholds must be
    bucket edges of ``engine``'s histograms (:mod:`generators.buckets`; a mapping gives each policy's own).
    """
    if not policies:
        raise ValidationError("dashboards need at least one SLO policy (its thresholds draw the SLO lines)")
    check_thresholds(policies, engine)
    documents = {
        "moeslo-slo-overview.json": to_json_dict(slo_overview_dashboard(policies)),
        "moeslo-engine.json": to_json_dict(engine_dashboard()),
        "moeslo-experts.json": to_json_dict(experts_dashboard(policies)),
        "moeslo-controller.json": to_json_dict(controller_dashboard(policies)),
    }
    for document in documents.values():
        # Recorded so that a reader knows which Grafana the JSON was built for.
        document.setdefault("tags", []).append(f"grafana-{GRAFANA_VERSION}")
    return documents


def render_dashboard_files(
    policies: Sequence[Policy], engine: EngineName | EngineBuckets | Mapping[str, EngineBuckets] = "moeslo"
) -> dict[str, str]:
    """File name -> JSON text (sorted keys, 2-space indent, trailing newline)."""
    return {
        name: json.dumps(document, indent=2, sort_keys=True) + "\n"
        for name, document in build_dashboards(policies, engine).items()
    }


__all__ = ["build_dashboards", "render_dashboard_files"]
