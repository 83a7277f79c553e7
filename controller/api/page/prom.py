"""A policy's time series from Prometheus range queries, made server-side for the status page.

The same PromQL the controller's source reads (``controller/sources/prometheus.py``), over a range and
over the controller's own windows (:class:`ChartWindows`: ``sli_window_s``, ``rate_window_s``):

- good ratios of TTFT and ITL over the SLI window (5 minutes by default), every bucket fetched and the
  good count taken at the threshold (:func:`~controller.sources.base.good_count_at`, interpolating when
  the threshold is no bucket edge), and TTFT's total counting the requests ended before a first token
  (:func:`~contracts.catalogue.ttft_events`), so each point is the ``ttft_good_ratio`` the controller would have seen;
- the request rate over the rate window (``rate(vllm:request_success_total[1m])`` by default), the series
  the forecaster learns from;
- the imbalance CV of each MoE layer (``moe_layer_imbalance_cv``), for the heatmap;
- and, for the verdicts, the TTFT requests per second over each burn-rate pair's short window
  (:func:`alert_request_rates`): the generated alerts' low-traffic guard, asked the same way.

Queries run concurrently; one that fails leaves its chart to the decision log and says why; when
all fail, :class:`UnavailableError` (Prometheus unreachable).  At most :data:`MAX_POINTS` points a
series, no step below one tick, and no window shorter than the step (:meth:`ChartWindows.covering`);
series that began late in the range (a new fleet, ``moeslo up``'s few minutes) are asked again over
the part they cover, at a finer step (:func:`chart_series`).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

from contracts.catalogue import (
    LAYER_IMBALANCE_CV,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    UNSERVED_MATCHER,
    total,
    ttft_events,
)
from contracts.errors import UnavailableError
from controller.policy import Policy
from controller.slo import format_duration, standard_burn_rate_windows
from controller.sources.base import HISTOGRAMS, REQUESTS_TOTAL, good_count_at, model_matcher, parse_le
from controller.sources.prometheus import PrometheusClient, Vector
from controller.ttft_series import ttft_matchers, ttft_metric

__all__ = [
    "ChartWindows", "PromSeries", "RequestRates", "alert_request_rates", "chart_series", "prometheus_series",
    "range_step_s",
]

Point = tuple[float, float | None]
Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]
MAX_POINTS = 240


@dataclass(frozen=True, slots=True)
class ChartWindows:
    """The controller's settings the charts follow, so they draw the series it acted on and forecast from."""

    rate_window_s: float
    sli_window_s: float
    tick_interval_s: float

    @property
    def rate_window(self) -> str:
        return format_duration(self.rate_window_s)

    @property
    def sli_window(self) -> str:
        return format_duration(self.sli_window_s)

    @property
    def min_step_s(self) -> float:
        """The finest step: one tick (the controller looks no more often), and 1 s at the least."""
        return max(1.0, self.tick_interval_s)

    def covering(self, step_s: float) -> ChartWindows:
        """These windows, each widened to one step where the step is longer: a 5-minute increase sampled every
        18 minutes never looks at 13 of them, and an outage there would not be drawn."""
        step = math.ceil(step_s)
        return replace(self, rate_window_s=max(self.rate_window_s, step), sli_window_s=max(self.sli_window_s, step))


@dataclass(frozen=True, slots=True)
class PromSeries:
    step_s: float
    windows: ChartWindows
    """The windows the series are over: the controller's, or one step where that is longer."""
    ttft_good: list[Point] = field(default_factory=list)
    itl_good: list[Point] = field(default_factory=list)
    load: list[Point] = field(default_factory=list)
    layer_cv: dict[int, list[Point]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Query key -> why it failed (its chart falls back to the decision log)."""
    queries: dict[str, str] = field(default_factory=dict)

    @property
    def first_s(self) -> float | None:
        """The earliest point of any series (None: no points)."""
        firsts = [points[0][0] for points in (self.ttft_good, self.itl_good, self.load, *self.layer_cv.values())
                  if points]
        return min(firsts, default=None)


def range_step_s(span_s: float, floor_s: float) -> float:
    """A step giving at most :data:`MAX_POINTS` points, a whole multiple of ``floor_s`` (the finest step)."""
    return max(floor_s, math.ceil(span_s / MAX_POINTS / floor_s) * floor_s)


def _matchers(models: list[str], selector: str) -> list[str]:
    """The model's matcher and the configured selector's (the source's own)."""
    return [m for m in (model_matcher(models), selector.strip().strip(",")) if m]


def _unserved(matchers: list[str]) -> str:
    """The requests the engines ended before a first token (deadline, error): TTFT events no histogram holds."""
    return total(REQUESTS_WITHOUT_FIRST_TOKEN) + "{" + ",".join([*matchers, UNSERVED_MATCHER]) + "}"


def _queries(policy: Policy, selector: str, windows: ChartWindows) -> dict[str, str]:
    matchers = _matchers([policy.model_name], selector)
    sel = "{" + ",".join(matchers) + "}"
    out = {}
    for slo, metric in HISTOGRAMS.items():
        name, labels = metric, sel
        allowance = policy.objectives.ttft.allowance
        if slo == "ttft" and not allowance.flat:  # the series the controller judges this objective by
            name, labels = ttft_metric(allowance), "{" + ",".join([*matchers, ttft_matchers(allowance)]) + "}"
        out[f"{slo}:good"] = f"sum by (le) (increase({name}_bucket{labels}[{windows.sli_window}]))"
        out[f"{slo}:total"] = f"sum(increase({name}_count{labels}[{windows.sli_window}]))"
        if slo == "ttft":  # the events the controller and the alert rules count
            unserved = f"sum(increase({_unserved(matchers)}[{windows.sli_window}]))"
            out[f"{slo}:total"] = ttft_events(out[f"{slo}:total"], unserved)
    out["load"] = f"sum(rate({REQUESTS_TOTAL}{sel}[{windows.rate_window}]))"
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


async def chart_series(
    client: PrometheusClient, policy: Policy, *, selector: str, start_s: float, end_s: float, windows: ChartWindows,
    finer_by: float | None = None,
) -> PromSeries:
    """:func:`prometheus_series` over the range; again over the part with data when it began late in the range
    and a finer step fits it (six hours at 90 s gave a three-minute run two points).  The first answer stands
    when the second fails or is not whole by ``finer_by`` (the event loop's time; None: no deadline of its own)."""
    ask = functools.partial(prometheus_series, client, policy, selector=selector, end_s=end_s, windows=windows)
    coarse = await ask(start_s=start_s, step_s=range_step_s(end_s - start_s, windows.min_step_s))
    first_s = coarse.first_s
    if first_s is None:
        return coarse
    start_s = max(start_s, first_s - coarse.step_s)
    step_s = range_step_s(end_s - start_s, windows.min_step_s)
    if step_s >= coarse.step_s:
        return coarse
    try:  # a deadline of its own: the caller's would throw the first answer away with it
        async with asyncio.timeout_at(finer_by):
            return await ask(start_s=start_s, step_s=step_s)
    except (UnavailableError, TimeoutError):
        return coarse


async def prometheus_series(
    client: PrometheusClient, policy: Policy, *, selector: str, start_s: float, end_s: float, step_s: float,
    windows: ChartWindows,
) -> PromSeries:
    """Every series of the policy page that Prometheus has; see the module docstring."""
    windows = windows.covering(step_s)
    queries = _queries(policy, selector, windows)
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
        step_s=step_s, windows=windows, ttft_good=ratios.get("ttft", []), itl_good=ratios.get("itl", []),
        load=list[Point](load[0][1]) if load else [], layer_cv=dict(sorted(layers.items())),
        errors=errors, queries=queries,
    )


RequestRates = dict[str, dict[str, float]]
"""Per policy: TTFT requests per second over each short window its burn-rate pairs read (windows whose query
failed are missing)."""


RateQueries = dict[tuple[str, str, str], tuple[str, list[Policy]]]


def _request_rate_queries(policies: list[Policy], selector: str) -> RateQueries:
    """(TTFT metric, its matchers, window) -> the query of its request rate by model, and the policies it is for."""
    groups: dict[tuple[str, str], list[Policy]] = defaultdict(list)
    for policy in policies:
        allowance = policy.objectives.ttft.allowance
        groups[(ttft_metric(allowance), ttft_matchers(allowance))].append(policy)
    out = {}
    for (metric, extra), members in groups.items():
        matchers = _matchers([p.model_name for p in members], selector)
        sel = ",".join([*matchers, *([extra] if extra else [])])
        windows = {w.short_window for p in members for w in standard_burn_rate_windows(p.window_s)}
        for window in sorted(windows):
            count = f"sum by (model_name) (rate({metric}_count{{{sel}}}[{window}]))"
            unserved = f"sum by (model_name) (rate({_unserved(matchers)}[{window}]))"
            out[(metric, extra, window)] = (ttft_events(count, unserved), members)
    return out


async def alert_request_rates(client: PrometheusClient, policies: list[Policy], *, selector: str) -> RequestRates:
    """Each policy's TTFT requests per second over the short window of each of its burn-rate pairs, now.

    What the generated alerts' low-traffic guard reads (``moeslo:slo_total_events:rate<short>{slo="ttft"}``:
    requests, not events, over the pair's *short* window, those ended before a first token included), asked of
    the series themselves, so it holds where the recording rules are not loaded.  A model without the series has
    no requests (0).  :class:`UnavailableError` when every query failed; a window whose query failed is left out
    (the caller falls back for that pair).
    """
    queries = _request_rate_queries(policies, selector)
    answers = await asyncio.gather(*(client.query(q) for q, _ in queries.values()), return_exceptions=True)
    out: RequestRates = {p.name: {} for p in policies}
    failed = []
    for ((_, _, window), (_, members)), answer in zip(queries.items(), answers, strict=True):
        if isinstance(answer, UnavailableError):
            failed.append(answer)
            continue
        if isinstance(answer, BaseException):
            raise answer
        by_model = _by_model(answer)
        for policy in members:
            if any(w.short_window == window for w in standard_burn_rate_windows(policy.window_s)):
                out[policy.name][window] = by_model.get(policy.model_name, 0.0)
    if failed and len(failed) == len(queries):
        raise failed[0]
    return out


def _by_model(vector: Vector) -> dict[str, float]:
    return {labels.get("model_name", ""): value for labels, value in vector}
