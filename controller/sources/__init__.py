"""SLI sources: Prometheus's HTTP API, or the engines' /metrics scraped directly."""

from __future__ import annotations

from contracts.histograms import histogram_quantile
from controller.sources.base import BURN_WINDOWS, SliSource, windows_for
from controller.sources.prometheus import PrometheusClient, PrometheusSource
from controller.sources.router_page import parse_router_queue
from controller.sources.scrape import EngineSample, ScrapeSource, parse_metrics

__all__ = [
    "BURN_WINDOWS",
    "EngineSample",
    "PrometheusClient",
    "PrometheusSource",
    "ScrapeSource",
    "SliSource",
    "histogram_quantile",
    "parse_metrics",
    "parse_router_queue",
    "windows_for",
]
