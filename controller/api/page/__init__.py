"""The controller's status page: server-rendered HTML and SVG over the API's own data (no JavaScript).

``/ui/`` lists every policy, the most urgent first; ``/ui/policies/{name}`` shows one with its
charts.  Modules: ``html`` (escaping builder), ``svg`` (charts), ``verdict`` (where a policy
stands), ``prom`` and ``alerts`` (Prometheus range queries, Alertmanager), ``policy_data`` and
``overview`` (gathering), ``policy_charts`` and ``policy_html`` (rendering), ``routes``.
"""

from __future__ import annotations

from controller.api.page.routes import router

__all__ = ["router"]
