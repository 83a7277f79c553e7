"""A policy's time series from Prometheus range queries, made server-side for the status page.

The same PromQL the controller's source reads (``controller/sources/prometheus.py``), over a range:

- good ratios of TTFT and ITL over 5 minutes, every bucket fetched and the good count taken at
  the threshold (:func:`~controller.sources.base.good_count_at`, interpolating when the threshold
  is no bucket edge), so each point is the ``ttft_good_ratio`` the controller would have seen;
- the request rate (``rate(vllm:request_success_total[1m])``);
- the imbalance CV of each MoE layer (``moe_layer_imbalance_cv``), for the heatmap.

Queries run concurrently; one that fails leaves its chart to the decision log and says why; when
all fail, :class:`UnavailableError` (Prometheus unreachable).
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from dataclasses import dataclass, field

from contracts.catalogue import LAYER_IMBALANCE_CV
from contracts.errors import UnavailableError
from controller.policy import Policy
from controller.sources.base import HISTOGRAMS, REQUESTS_TOTAL, SHORT_WINDOW, good_count_at, model_matcher, parse_le
from controller.sources.prometheus import PrometheusClient
from controller.ttft_series import ttft_matchers, ttft_metric

__all__ = ["PromSeries", "prometheus_series", "range_step_s"]

Point = tuple[float, float | None]
Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]
MAX_POINTS = 240


@dataclass(frozen=True, slots=True)
class PromSeries:
    step_s: float
    ttft_good: list[Point] = field(default_factory=list)
    itl_good: list[Point] = field(default_factory=list)
    load: list[Point] = field(default_factory=list)
    layer_cv: dict[int, list[Point]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Query key -> why it failed (its chart falls back to the decision log)."""
    queries: dict[str, str] = field(default_factory=dict)


def range_step_s(span_s: float, floor_s: float = 15.0) -> float:
    """A step giving at most :data:`MAX_POINTS` points, a whole multiple of ``floor_s``."""
    return max(floor_s, math.ceil(span_s / MAX_POINTS / floor_s) * floor_s)


def _queries(policy: Policy, selector: str) -> dict[str, str]:
    matchers = [model_matcher([policy.model_name])]
    if selector.strip().strip(","):
        matchers.append(selector.strip().strip(","))
    sel = "{" + ",".join(matchers) + "}"
    out = {}
    for slo, metric in HISTOGRAMS.items():
        name, labels = metric, sel
        allowance = policy.objectives.ttft.allowance
        if slo == "ttft" and not allowance.flat:  # the series the controller judges this objective by
            name, labels = ttft_metric(allowance), "{" + ",".join([*matchers, ttft_matchers(allowance)]) + "}"
        out[f"{slo}:good"] = f"sum by (le) (increase({name}_bucket{labels}[{SHORT_WINDOW}]))"
        out[f"{slo}:total"] = f"sum(increase({name}_count{labels}[{SHORT_WINDOW}]))"
    out["load"] = f"sum(rate({REQUESTS_TOTAL}{sel}[1m]))"
    out["layers"] = f"max by (layer) ({LAYER_IMBALANCE_CV}{sel})"
    return out


def _good_ratio(good: Matrix, total: Matrix, threshold_s: float) -> list[Point]:
    buckets: dict[float, dict[float, float]] = defaultdict(dict)
    for labels, points in good:
        le = parse_le(labels.get("le", ""))
        if le is None:
            continue
        for t, v in points:  # le="1" and le="1.0" (two exporters' spellings) are one edge: summed
            buckets[t][le] = buckets[t].get(le, 0.0) + v
    out: list[Point] = []
    for t, count in (total[0][1] if total else []):
        hit = good_count_at(buckets.get(t, {}), threshold_s)
        out.append((t, None if count <= 0 or hit is None else min(1.0, max(0.0, hit / count))))
    return out


async def prometheus_series(
    client: PrometheusClient, policy: Policy, *, selector: str, start_s: float, end_s: float, step_s: float
) -> PromSeries:
    """Every series of the policy page that Prometheus has; see the module docstring."""
    queries = _queries(policy, selector)
    answers = await asyncio.gather(
        *(client.query_range(q, start_s=start_s, end_s=end_s, step_s=step_s) for q in queries.values()),
        return_exceptions=True,
    )
    results: dict[str, Matrix] = {}
    errors: dict[str, str] = {}
    for key, answer in zip(queries, answers, strict=True):
        if isinstance(answer, UnavailableError):
            errors[key] = str(answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            results[key] = answer
    if not results:
        raise UnavailableError(next(iter(errors.values())))
    ratios = {}
    for slo in HISTOGRAMS:
        if f"{slo}:good" in results and f"{slo}:total" in results:
            threshold: float = getattr(policy.objectives, slo).threshold_s
            ratios[slo] = _good_ratio(results[f"{slo}:good"], results[f"{slo}:total"], threshold)
    load = results.get("load")
    layers = {
        int(labels["layer"]): list[Point](points)
        for labels, points in results.get("layers", [])
        if labels.get("layer", "").isdigit()
    }
    return PromSeries(
        step_s=step_s, ttft_good=ratios.get("ttft", []), itl_good=ratios.get("itl", []),
        load=list[Point](load[0][1]) if load else [], layer_cv=dict(sorted(layers.items())),
        errors=errors, queries=queries,
    )
