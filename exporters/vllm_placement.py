"""The vLLM plugin's rebalance metrics: ``moe_placement_*`` from the workers' placement logs.

A worker's snapshot carries its :class:`~engine.vllm_plugin.placement_log.PlacementLog`
as JSON (``ExpertLoadSnapshot.placement``); these translate it, for the two
routes of ``exporters.vllm_metrics`` (families built on each scrape, or
multiprocess ``prometheus_client`` metrics fed with deltas).  Series:

* ``moe_placement_swaps_total``, ``moe_placement_experts_moved_total``,
  ``moe_placement_swap_duration_seconds``: as the embedded engine writes them
  (rearrangements, the trigger's and vLLM's own, expert replicas copied to a
  new rank, the step stall where it was measured);
* ``moe_placement_requests_total{action, outcome}``: dry runs (``plan``) and
  rearrangements (``apply``): ``ok``, ``refused``, ``invalid``, ``failed``;
* ``moe_placement_imbalance_cv{when, source}`` (worst layer) and
  ``moe_placement_balancedness{when, source}`` (lowest layer) of the last
  rearrangement: ``when`` is ``before``/``after``, ``source`` is
  ``predicted`` (the plan's load) or ``measured`` (routing counted before it,
  and after it on the new placement, updated every flush).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import product
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from contracts.catalogue import (
    ACTION_LABEL,
    BASE_LABELS,
    OUTCOME_LABEL,
    PLACEMENT_BALANCEDNESS,
    PLACEMENT_EXPERTS_MOVED,
    PLACEMENT_HELP,
    PLACEMENT_IMBALANCE_CV,
    PLACEMENT_REQUESTS,
    PLACEMENT_SWAP_DURATION_HISTOGRAM,
    PLACEMENT_SWAPS,
    SOURCE_LABEL,
    SWAP_DURATION_BUCKETS_S,
    WHEN_LABEL,
    format_le,
)
from engine.vllm_plugin import ExpertLoadSnapshot
from engine.vllm_plugin.placement_log import BALANCE_SOURCES, BALANCE_WHEN

BALANCE_FIGURES = {PLACEMENT_IMBALANCE_CV: "cv_max", PLACEMENT_BALANCEDNESS: "balancedness_min"}


def balance_values(log: dict[str, Any]) -> Iterable[tuple[str, str, str, float]]:
    """(metric, when, source, value) for each balance figure the log has."""
    balance = log.get("balance") or {}
    for (metric, key), when, source in product(BALANCE_FIGURES.items(), BALANCE_WHEN, BALANCE_SOURCES):
        figure = balance.get(f"{source}_{when}")
        if figure is not None:
            yield metric, when, source, float(figure[key])


def placement_families(snapshots: Iterable[ExpertLoadSnapshot]) -> list[Metric]:
    """The ``moe_placement_*`` families of the snapshots that carry a placement log."""
    labels = list(BASE_LABELS)
    swaps = CounterMetricFamily(PLACEMENT_SWAPS, PLACEMENT_HELP[PLACEMENT_SWAPS], labels=labels)
    moved = CounterMetricFamily(PLACEMENT_EXPERTS_MOVED, PLACEMENT_HELP[PLACEMENT_EXPERTS_MOVED], labels=labels)
    durations = HistogramMetricFamily(PLACEMENT_SWAP_DURATION_HISTOGRAM,
                                      PLACEMENT_HELP[PLACEMENT_SWAP_DURATION_HISTOGRAM], labels=labels)  # fmt: skip
    requests = CounterMetricFamily(PLACEMENT_REQUESTS, PLACEMENT_HELP[PLACEMENT_REQUESTS],
                                   labels=[*labels, ACTION_LABEL, OUTCOME_LABEL])  # fmt: skip
    gauges = {name: GaugeMetricFamily(name, PLACEMENT_HELP[name], labels=[*labels, WHEN_LABEL, SOURCE_LABEL])
              for name in BALANCE_FIGURES}  # fmt: skip
    found = False
    for snap in snapshots:
        log = snap.placement
        if not log:
            continue
        found = True
        base = [snap.model_name, snap.engine]
        swaps.add_metric(base, int(log["swaps"]))
        moved.add_metric(base, int(log["experts_moved"]))
        cumulative, buckets = 0, []
        for edge, count in zip([*SWAP_DURATION_BUCKETS_S, float("inf")], log["duration_buckets"], strict=True):
            cumulative += int(count)
            buckets.append(("+Inf" if edge == float("inf") else format_le(edge), cumulative))
        durations.add_metric(base, buckets, sum_value=float(log["duration_sum_s"]))
        for key, count in sorted(log["requests"].items()):
            action, _, outcome = key.partition("/")
            requests.add_metric([*base, action, outcome], int(count))
        for metric, when, source, value in balance_values(log):
            gauges[metric].add_metric([*base, when, source], value)
    return [swaps, moved, durations, requests, *gauges.values()] if found else []


class PlacementMetrics:
    """Multiprocess route: ordinary metrics in the worker, fed with what changed since the last snapshot."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = list(BASE_LABELS)
        self.swaps = Counter(PLACEMENT_SWAPS, PLACEMENT_HELP[PLACEMENT_SWAPS], labels, registry=registry)
        self.moved = Counter(PLACEMENT_EXPERTS_MOVED, PLACEMENT_HELP[PLACEMENT_EXPERTS_MOVED], labels,
                             registry=registry)  # fmt: skip
        self.durations = Histogram(PLACEMENT_SWAP_DURATION_HISTOGRAM, PLACEMENT_HELP[PLACEMENT_SWAP_DURATION_HISTOGRAM],
                                   labels, buckets=SWAP_DURATION_BUCKETS_S, registry=registry)  # fmt: skip
        self.requests = Counter(PLACEMENT_REQUESTS, PLACEMENT_HELP[PLACEMENT_REQUESTS],
                                [*labels, ACTION_LABEL, OUTCOME_LABEL], registry=registry)  # fmt: skip
        self.gauges = {name: Gauge(name, PLACEMENT_HELP[name], [*labels, WHEN_LABEL, SOURCE_LABEL], registry=registry,
                                   multiprocess_mode="mostrecent") for name in BALANCE_FIGURES}  # fmt: skip
        self._swaps = self._moved = self._timed = 0
        self._requests: dict[str, int] = {}

    def publish(self, snapshot: ExpertLoadSnapshot) -> None:
        log = snapshot.placement
        if not log:
            return
        base = (snapshot.model_name, snapshot.engine)
        if int(log["swaps"]) > self._swaps:
            self.swaps.labels(*base).inc(int(log["swaps"]) - self._swaps)
        # Stalls by their own count: a rearrangement vLLM made itself, or async EPLB's, has none.
        timed = sum(int(n) for n in log["duration_buckets"])
        recent = list(log["recent_durations_s"])
        for duration in recent[max(0, len(recent) - (timed - self._timed)):] if timed > self._timed else []:
            self.durations.labels(*base).observe(float(duration))
        if int(log["experts_moved"]) > self._moved:
            self.moved.labels(*base).inc(int(log["experts_moved"]) - self._moved)
        self._swaps, self._moved, self._timed = int(log["swaps"]), int(log["experts_moved"]), timed
        for key, count in log["requests"].items():
            if int(count) > self._requests.get(key, 0):
                action, _, outcome = key.partition("/")
                self.requests.labels(*base, action, outcome).inc(int(count) - self._requests.get(key, 0))
                self._requests[key] = int(count)
        for metric, when, source, value in balance_values(log):
            self.gauges[metric].labels(*base, when, source).set(value)


__all__ = ["BALANCE_FIGURES", "PlacementMetrics", "balance_values", "placement_families"]
