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

Under pipeline parallelism each stage's counting worker has a log: the first stage's counts the
engine's requests, rearrangements and stalls and holds the balance figures (of its own layers), a
later stage's only the replicas its own layers moved.  Both routes sum the stages (the snapshot
route per engine, :func:`merged_log`; the multiprocess route as ``prometheus_client`` sums the
processes' counters), so there is one series per engine and ``experts_moved`` covers every stage.
"""

from __future__ import annotations

import math
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
BALANCE_WORST = {PLACEMENT_IMBALANCE_CV: max, PLACEMENT_BALANCEDNESS: min}
"""How two stages' figures combine into the engine's worst layer."""


def balance_values(log: dict[str, Any]) -> Iterable[tuple[str, str, str, float]]:
    """(metric, when, source, value) for each balance figure the log has."""
    balance = log.get("balance") or {}
    for (metric, key), when, source in product(BALANCE_FIGURES.items(), BALANCE_WHEN, BALANCE_SOURCES):
        figure = balance.get(f"{source}_{when}")
        if figure is not None:
            yield metric, when, source, float(figure[key])


def engine_logs(snapshots: Iterable[ExpertLoadSnapshot]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (model_name, engine): the placement logs of its workers, one per pipeline stage."""
    logs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for snap in snapshots:
        if snap.placement:
            logs.setdefault((snap.model_name, snap.engine), []).append(snap.placement)
    return logs


def merged_log(logs: list[dict[str, Any]]) -> dict[str, Any]:
    """An engine's stages' logs as one, summed as the multiprocess route's counters are: a stage after the
    first logs only the replicas its own layers moved, so each rearrangement and request counts once."""
    buckets = [sum(int(log["duration_buckets"][i]) for log in logs) for i in range(len(SWAP_DURATION_BUCKETS_S) + 1)]
    requests: dict[str, int] = {}
    for log in logs:
        for key, count in log["requests"].items():
            requests[key] = requests.get(key, 0) + int(count)
    return {"swaps": sum(int(log["swaps"]) for log in logs),
            "experts_moved": sum(int(log["experts_moved"]) for log in logs), "duration_buckets": buckets,
            "duration_sum_s": sum(float(log["duration_sum_s"]) for log in logs), "requests": requests}  # fmt: skip


def worst_balance(logs: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(metric, when, source) -> the worst layer's figure over the logs that have it."""
    worst: dict[tuple[str, str, str], float] = {}
    for log in logs:
        for metric, when, source, value in balance_values(log):
            key = (metric, when, source)
            worst[key] = BALANCE_WORST[metric](worst.get(key, value), value)
    return worst


def placement_families(snapshots: Iterable[ExpertLoadSnapshot]) -> list[Metric]:
    """The ``moe_placement_*`` families of the snapshots that carry a placement log, one series per engine."""
    labels = list(BASE_LABELS)
    swaps = CounterMetricFamily(PLACEMENT_SWAPS, PLACEMENT_HELP[PLACEMENT_SWAPS], labels=labels)
    moved = CounterMetricFamily(PLACEMENT_EXPERTS_MOVED, PLACEMENT_HELP[PLACEMENT_EXPERTS_MOVED], labels=labels)
    durations = HistogramMetricFamily(PLACEMENT_SWAP_DURATION_HISTOGRAM,
                                      PLACEMENT_HELP[PLACEMENT_SWAP_DURATION_HISTOGRAM], labels=labels)  # fmt: skip
    requests = CounterMetricFamily(PLACEMENT_REQUESTS, PLACEMENT_HELP[PLACEMENT_REQUESTS],
                                   labels=[*labels, ACTION_LABEL, OUTCOME_LABEL])  # fmt: skip
    gauges = {name: GaugeMetricFamily(name, PLACEMENT_HELP[name], labels=[*labels, WHEN_LABEL, SOURCE_LABEL])
              for name in BALANCE_FIGURES}  # fmt: skip
    logs = engine_logs(snapshots)
    for (model_name, engine), stage_logs in logs.items():
        base, log = [model_name, engine], merged_log(stage_logs)
        swaps.add_metric(base, log["swaps"])
        moved.add_metric(base, log["experts_moved"])
        cumulative, buckets = 0, []
        for edge, count in zip([*SWAP_DURATION_BUCKETS_S, float("inf")], log["duration_buckets"], strict=True):
            cumulative += count
            buckets.append(("+Inf" if edge == float("inf") else format_le(edge), cumulative))
        durations.add_metric(base, buckets, sum_value=log["duration_sum_s"])
        for key, count in sorted(log["requests"].items()):
            action, _, outcome = key.partition("/")
            requests.add_metric([*base, action, outcome], count)
        for (metric, when, source), value in worst_balance(stage_logs).items():
            gauges[metric].add_metric([*base, when, source], value)
    return [swaps, moved, durations, requests, *gauges.values()] if logs else []


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
        self._figures_set: set[tuple[str, str, str]] = set()

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
        # A figure the log no longer has (a rearrangement not yet measured after) is NaN: a multiprocess gauge
        # cannot be removed, and the last rearrangement's value would read as this one's (the snapshot route
        # leaves it out).
        figures = {(metric, when, source): value for metric, when, source, value in balance_values(log)}
        for metric, when, source in self._figures_set | figures.keys():
            self.gauges[metric].labels(*base, when, source).set(figures.get((metric, when, source), math.nan))
        self._figures_set |= figures.keys()


__all__ = [
    "BALANCE_FIGURES",
    "BALANCE_WORST",
    "PlacementMetrics",
    "balance_values",
    "engine_logs",
    "merged_log",
    "placement_families",
    "worst_balance",
]
