"""Grafana dashboards as code (grafana-foundation-sdk, Grafana 10.1 JSON).

``slo_overview``, ``engine``, ``experts`` and ``controller_view`` each build one
dashboard; ``render`` turns them into the JSON files under ``dashboards/``;
``push`` uploads them through grafana-client (the optional ``grafana`` extra).
"""

from __future__ import annotations

from generators.dashboards.panels import GRAFANA_VERSION, expressions
from generators.dashboards.render import build_dashboards, render_dashboard_files

__all__ = ["GRAFANA_VERSION", "build_dashboards", "expressions", "render_dashboard_files"]
