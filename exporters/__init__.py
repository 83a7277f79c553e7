"""Exporters: sinks that turn the engine's plain-data stats into metrics, and the wiring.

- :class:`~exporters.prometheus.PrometheusStatsSink`: ``vllm:*`` and ``moe_*`` metrics in an
  injected registry, rendered for ``/metrics``.
- :class:`~exporters.otel.OtelStatsSink`: GenAI semantic-convention histograms and request spans
  over OTLP/HTTP.
- :func:`~exporters.app.build_stack` / :class:`~exporters.app.ServeOptions`: an engine, its HTTP
  API and its exporters, wired together (``engine/`` never imports this package).

Metric names and histogram edges come from :mod:`contracts.catalogue`.  Names resolve
lazily, so importing one exporter does not load the OpenTelemetry SDK.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporters.app import ServeOptions, ServingStack, build_stack
    from exporters.otel import OtelStatsSink
    from exporters.prometheus import PrometheusStatsSink

_HOMES = {
    "OtelStatsSink": "exporters.otel",
    "PrometheusStatsSink": "exporters.prometheus",
    "ServeOptions": "exporters.app",
    "ServingStack": "exporters.app",
    "build_stack": "exporters.app",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'exporters' has no attribute {name!r}")
    return getattr(import_module(home), name)


__all__ = ["OtelStatsSink", "PrometheusStatsSink", "ServeOptions", "ServingStack", "build_stack"]
