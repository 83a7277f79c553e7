"""SLI sources: Prometheus's HTTP API, or the engines' /metrics scraped directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from contracts.histograms import histogram_quantile
from controller.sources.base import BURN_WINDOWS, SliSource, windows_for
from controller.sources.prometheus import PrometheusClient, PrometheusSource
from controller.sources.router_page import parse_router_queue
from controller.sources.scrape import EngineSample, ScrapeSource, parse_metrics

if TYPE_CHECKING:
    from controller.config import ControllerSettings
    from controller.policy import Policy

__all__ = [
    "BURN_WINDOWS",
    "EngineSample",
    "PrometheusClient",
    "PrometheusSource",
    "ScrapeSource",
    "SliSource",
    "configured_source",
    "histogram_quantile",
    "parse_metrics",
    "parse_router_queue",
    "windows_for",
]


def configured_source(
    settings: ControllerSettings, endpoints_for: Callable[[Policy], list[str]]
) -> tuple[SliSource, PrometheusClient | None]:
    """Prometheus when the configuration names one (and its client, for the load history), else direct scrapes."""
    if settings.prometheus_url is None:
        return ScrapeSource(endpoints_for, timeout_s=settings.source_timeout_s, rate_window_s=settings.rate_window_s,
                            sli_window_s=settings.sli_window_s), None  # fmt: skip
    client = PrometheusClient(settings.prometheus_url, timeout_s=settings.source_timeout_s)
    return PrometheusSource(client, selector=settings.prometheus_selector, rate_window_s=settings.rate_window_s,
                            sli_window_s=settings.sli_window_s), client  # fmt: skip
