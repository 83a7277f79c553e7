"""What the controllers of a replay can see: the simulated fleet's metrics, scraped late.

The simulated fleet records a :class:`TickSample` at the end of every tick: the
gauges a vLLM replica exports (``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``, summed over ready
replicas) and what finished during the tick (the increments of the request,
token and latency counters).  Nothing in a sample is *offered* load: a fleet
that is overloaded serves less than arrives, and the rates saturate, exactly
as the counters of a real fleet do.

:class:`MetricsPipeline` keeps those samples as Prometheus would and answers
each controller with what its real counterpart reads (sources in
``docs/replay-model.md``):

- a scrape every ``scrape_s`` (30 s, kube-prometheus-stack's default; Dynamo's
  frontend PodMonitor scrapes every 5 s): a query sees the newest scrape at or
  before ``now``;
- ``rate(x[W])`` and ``increase(x[W])`` are counter differences between two
  scrapes ``W`` apart (no extrapolation);
- :meth:`MetricsPipeline.observation` is the production source's view
  (:mod:`controller.sources.prometheus`): sums of the gauges, ``rate(...[1m])``
  of requests and tokens, the highest request rate between scrapes 30 s apart in the
  SLI window (:mod:`controller.bursts`), a :class:`SliSnapshot` over the last 5 minutes (good
  ratios, p99s, requests and token gaps in the window), the finished requests' prefill speed over
  the same 5 minutes, and good ratios over the burn windows,
  the engine count from the scrape, the replica count asked for from the
  orchestrator (no lag);
- :meth:`MetricsPipeline.frontend_window` is what Dynamo's planner reads
  (``increase()`` of the frontend histograms' sums and counts over its interval);
- :meth:`MetricsPipeline.gauge` and :meth:`MetricsPipeline.rate` answer the
  single PromQL queries of KEDA triggers and custom-metrics adapters.

The SLIs come from latency histograms, as the production source reads them: each sample
carries the tick's bucket counts on the engines' edges (``TTFT_BUCKETS_S``,
``ITL_BUCKETS_S``), good ratios are the counts at the threshold over the window's total
(:func:`controller.sources.base.good_count_at`, interpolated inside a bucket when the
threshold is no edge) and p99s are ``histogram_quantile(0.99, increase(bucket[5m]))``
(:func:`contracts.histograms.histogram_quantile`), never the requests' exact values.

This module is the one observation builder of the replay: every strategy reads
the fleet through it and through nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from contracts.catalogue import ITL_BUCKETS_S, PROMPT_TOKENS_BUCKETS, TTFT_BUCKETS_S
from contracts.errors import ValidationError
from contracts.histograms import histogram_quantile
from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
from contracts.traces import FloatArray
from controller.bursts import PEAK_STEP_S
from controller.policy import parse_duration_s
from controller.sources.base import BURN_WINDOWS, QUANTILE, RATE_WINDOW_S, SHORT_WINDOW, good_count_at
from controller.types import PolicyObservation, SliSnapshot

__all__ = ["FleetView", "FrontendWindow", "MetricsPipeline", "TickSample", "cumulative_counts"]

SLI_WINDOW_S = float(parse_duration_s(SHORT_WINDOW))
_SLI_BY_WINDOW = tuple(w for w in BURN_WINDOWS if parse_duration_s(w) <= 6 * 3600)
"""Burn windows a replay keeps good ratios for (the longer ones only matter over days)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TickSample:
    """The fleet at the end of one tick (gauges) and what finished during it (counter increments)."""

    ready: int
    """Replicas serving (each exports its own series)."""
    waiting: float
    """Requests arrived and not yet scheduled, summed over replicas."""
    running: float
    """Requests in the running batches, summed over replicas."""
    kv_usage_sum: float
    """Sum over ready replicas of the KV-cache usage fraction."""
    finished: float
    """Requests that finished in the tick."""
    prompt_tokens: float
    """Prompt tokens prefilled in the tick."""
    output_tokens: float
    """Output tokens of the requests that finished in the tick."""
    ttft_sum_s: float
    itl_sum_s: float
    """Sum of the finished requests' mean inter-token latencies."""
    duration_sum_s: float
    """Sum of the finished requests' durations (arrival to last token)."""
    prefix_queries: float = 0.0
    """Prompt tokens looked up in the prefix cache (``vllm:prefix_cache_queries``) in the tick."""
    prefix_hits: float = 0.0
    """Of them, tokens found cached (``vllm:prefix_cache_hits``)."""
    finished_prompt_tokens: float = 0.0
    """Prompt tokens of the requests that finished in the tick (``vllm:request_prompt_tokens_sum``)."""
    prefill_s_sum: float = 0.0
    """Their prefill time, first scheduled to first token (``vllm:request_prefill_time_seconds_sum``)."""
    kv_demand_max: float = 0.0
    """The highest, over ready replicas, of (KV tokens of its running requests + prompt tokens queued on it) over
    its KV capacity: what Dynamo's planner reads from each aggregated engine's forward-pass metrics."""
    prompt_le: tuple[float, ...] = ()
    """Finished requests of the tick at each ``vllm:request_prompt_tokens`` edge, cumulative, then +Inf
    (empty: the fleet does not know its requests' lengths)."""
    ttft_le: tuple[float, ...] = ()
    """Requests finished in the tick at or under each ``TTFT_BUCKETS_S`` edge, cumulative, then +Inf: the
    TTFT histogram's increments (less each prompt's long-prompt allowance, as the normalized one records it)."""
    itl_le: tuple[float, ...] = ()
    """Token gaps of the requests finished in the tick at or under each ``ITL_BUCKETS_S`` edge, cumulative, then
    +Inf: the ITL histogram's increments (one observation a gap, as the engines record)."""


_COUNTERS = (
    "finished",
    "prompt_tokens",
    "output_tokens",
    "ttft_sum_s",
    "itl_sum_s",
    "duration_sum_s",
    "prefix_queries",
    "prefix_hits",
    "finished_prompt_tokens",
    "prefill_s_sum",
)
_GAUGES = ("ready", "waiting", "running", "kv_usage_sum", "kv_demand_max")
_HISTOGRAM_EDGES: dict[str, tuple[float, ...]] = {
    "prompt_le": (*PROMPT_TOKENS_BUCKETS, math.inf),
    "ttft_le": (*TTFT_BUCKETS_S, math.inf),
    "itl_le": (*ITL_BUCKETS_S, math.inf),
}
"""Each histogram a sample carries, by field: its upper edges, the engines' exporters' own."""
assert set(_COUNTERS) | set(_GAUGES) | set(_HISTOGRAM_EDGES) == {f.name for f in fields(TickSample)}


def cumulative_counts(
    values: FloatArray, edges: tuple[float, ...], weights: FloatArray | None = None
) -> tuple[float, ...]:
    """Observations (of ``weights`` each) at or under each edge, then all of them: a histogram's ``_bucket``."""
    order = np.argsort(values, kind="stable")
    totals = np.r_[0.0, np.cumsum(np.ones(len(values)) if weights is None else weights[order])]
    at_edges = totals[np.searchsorted(values[order], edges, side="right")]
    return (*(float(c) for c in at_edges), float(totals[-1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontendWindow:
    """Means over an interval from ``increase()`` of a frontend's histograms (Dynamo's observation)."""

    requests: float
    """``increase(requests_total[W])``: a count, not a rate."""
    ttft_mean_s: float | None
    itl_mean_s: float | None
    duration_mean_s: float | None
    prompt_mean_tokens: float | None
    output_mean_tokens: float | None

    @property
    def valid(self) -> bool:
        """Dynamo's ``Metrics.is_valid``: every mean defined (some traffic finished)."""
        values = (self.ttft_mean_s, self.itl_mean_s, self.prompt_mean_tokens, self.output_mean_tokens)
        return all(v is not None and math.isfinite(v) for v in values)


class MetricsPipeline:
    """Per-tick samples kept as Prometheus keeps scrapes; queries answered as of a tick."""

    def __init__(
        self,
        *,
        tick_s: float,
        ticks: int,
        scrape_s: float = 30.0,
        rate_window_s: float = RATE_WINDOW_S,
        ttft_threshold_s: float = TTFT_THRESHOLD_S,
        itl_threshold_s: float = ITL_THRESHOLD_S,
    ) -> None:
        if tick_s <= 0 or ticks <= 0:
            raise ValidationError(f"tick_s and ticks must be > 0, got {tick_s} and {ticks}")
        self.tick_s = tick_s
        self.ticks = ticks
        self.scrape_s = scrape_s
        self.rate_window_s = rate_window_s
        self.thresholds_s = {"ttft_le": ttft_threshold_s, "itl_le": itl_threshold_s}
        """The SLO thresholds the good counts are read at (the policy's objectives)."""
        # Row k + 1 holds the counters after tick k (row 0: before the first tick).
        self._counters = np.zeros((ticks + 1, len(_COUNTERS)))
        self._gauges = np.full((ticks + 1, len(_GAUGES)), np.nan)
        self._histograms = {name: np.zeros((ticks + 1, len(edges))) for name, edges in _HISTOGRAM_EDGES.items()}
        self._recorded = 0
        self._column = {name: i for i, name in enumerate(_COUNTERS)}
        self._gauge_column = {name: i for i, name in enumerate(_GAUGES)}

    def record(self, tick: int, sample: TickSample) -> None:
        """Store the sample taken at the end of ``tick`` (ticks in order, from 0)."""
        if tick != self._recorded:
            raise ValidationError(f"samples must come in tick order: expected tick {self._recorded}, got {tick}")
        row = tick + 1
        self._counters[row] = self._counters[tick] + [getattr(sample, name) for name in _COUNTERS]
        self._gauges[row] = [_nan_if_none(getattr(sample, name)) for name in _GAUGES]
        for name, counts in self._histograms.items():
            counts[row] = counts[tick] + (getattr(sample, name) or 0.0)
        self._recorded += 1

    def scrape_row(self, tick: int, scrape_s: float | None = None) -> int:
        """The row of the newest scrape visible at the end of ``tick`` (0: none yet)."""
        every = self.scrape_s if scrape_s is None else scrape_s
        now_s = (tick + 1) * self.tick_s
        scraped_s = math.floor(now_s / every + 1e-9) * every
        return min(max(math.floor(scraped_s / self.tick_s + 1e-9), 0), self._recorded)

    def _back(self, row: int, window_s: float) -> int:
        return max(row - round(window_s / self.tick_s), 0)

    def increase(self, tick: int, name: str, window_s: float, scrape_s: float | None = None) -> float:
        row = self.scrape_row(tick, scrape_s)
        column = self._column[name]
        return float(self._counters[row, column] - self._counters[self._back(row, window_s), column])

    def rate(self, tick: int, name: str, window_s: float, scrape_s: float | None = None) -> float:
        """``rate(name[window])`` as of the newest scrape (over the history there is, if shorter)."""
        row = self.scrape_row(tick, scrape_s)
        covered_s = (row - self._back(row, window_s)) * self.tick_s
        return self.increase(tick, name, window_s, scrape_s) / covered_s if covered_s > 0 else 0.0

    def peak_rate(self, tick: int, name: str, window_s: float) -> float | None:
        """``max_over_time(rate(name[...])[window:])``: the highest rate between scrapes at least ``PEAK_STEP_S``
        apart in the window ending at the newest scrape (None with no two such scrapes)."""
        row = self.scrape_row(tick)
        row_step = max(round(self.scrape_s / self.tick_s), 1)  # ticks between scrapes
        lag = max(math.ceil(PEAK_STEP_S / (row_step * self.tick_s) - 1e-9), 1)  # scrapes per peak step
        rows = np.arange(row, self._back(row, window_s) - 1, -row_step)[::-1]
        if len(rows) <= lag:
            return None
        values = self._counters[rows, self._column[name]]
        return float(np.max(values[lag:] - values[:-lag])) / (lag * row_step * self.tick_s)

    def gauge(self, tick: int, name: str, scrape_s: float | None = None) -> float | None:
        """The gauge as of the newest scrape (None before the first one, or when the fleet had no value)."""
        row = self.scrape_row(tick, scrape_s)
        if row == 0:
            return None
        value = float(self._gauges[row, self._gauge_column[name]])
        return None if math.isnan(value) else value

    def frontend_window(self, tick: int, window_s: float, scrape_s: float | None = None) -> FrontendWindow:
        """Means of the requests that finished in the window ending at the newest scrape."""
        count = self.increase(tick, "finished", window_s, scrape_s)

        def mean(name: str) -> float | None:
            return self.increase(tick, name, window_s, scrape_s) / count if count > 0 else None

        return FrontendWindow(
            requests=count,
            ttft_mean_s=mean("ttft_sum_s"),
            itl_mean_s=mean("itl_sum_s"),
            duration_mean_s=mean("duration_sum_s"),
            prompt_mean_tokens=mean("prompt_tokens"),
            output_mean_tokens=mean("output_tokens"),
        )

    def observation(self, tick: int, now_s: float, *, current_replicas: int) -> PolicyObservation:
        """What the production Prometheus source reports for the fleet at the end of ``tick``."""
        ready = self.gauge(tick, "ready")
        if ready is None:
            return PolicyObservation(policy="replay", observed_at_s=now_s, current_replicas=current_replicas)
        kv_sum = self.gauge(tick, "kv_usage_sum")
        window = self.rate_window_s
        return PolicyObservation(
            policy="replay",
            observed_at_s=now_s,
            current_replicas=current_replicas,
            ready_replicas=int(ready),
            queue_depth=self.gauge(tick, "waiting"),
            running_requests=self.gauge(tick, "running"),
            request_rate_rps=self.rate(tick, "finished", window),
            request_rate_peak_rps=self.peak_rate(tick, "finished", SLI_WINDOW_S),
            prompt_tokens_per_s=self.rate(tick, "prompt_tokens", window),
            output_tokens_per_s=self.rate(tick, "output_tokens", window),
            kv_cache_usage=kv_sum / ready if kv_sum is not None and ready > 0 else None,
            sli=self.sli(tick, now_s),
            prefix_cache_hit_rate=self._hit_rate(tick),
            prefill_tokens_per_s=self._prefill_speed(tick),
        )

    def _prefill_speed(self, tick: int) -> float | None:
        """``increase(prompt_tokens_sum[5m]) / increase(prefill_time_seconds_sum[5m])`` (None: nothing finished)."""
        seconds = self.increase(tick, "prefill_s_sum", SLI_WINDOW_S)
        tokens = self.increase(tick, "finished_prompt_tokens", SLI_WINDOW_S)
        return tokens / seconds if seconds > 0 and tokens > 0 else None

    def _hit_rate(self, tick: int) -> float | None:
        """``rate(prefix_cache_hits[5m]) / rate(prefix_cache_queries[5m])`` (None: nothing looked up)."""
        queries = self.increase(tick, "prefix_queries", SLI_WINDOW_S)
        return self.increase(tick, "prefix_hits", SLI_WINDOW_S) / queries if queries > 0 else None

    def buckets(self, tick: int, name: str, window_s: float) -> dict[float, float]:
        """``increase(<histogram>_bucket[W])`` by upper edge, as of the newest scrape (``name``: the sample's field)."""
        row = self.scrape_row(tick)
        counts = self._histograms[name][row] - self._histograms[name][self._back(row, window_s)]
        return dict(zip(_HISTOGRAM_EDGES[name], counts.tolist(), strict=True))

    def prompt_buckets(self, tick: int, window_s: float) -> tuple[tuple[float, float], ...]:
        """``increase(vllm:request_prompt_tokens_bucket[W])`` by edge (empty when no lengths were recorded)."""
        counts = self.buckets(tick, "prompt_le", window_s)
        return tuple(counts.items()) if counts[math.inf] > 0 else ()

    def _good_ratio(self, tick: int, name: str, window_s: float) -> float | None:
        """Observations at or under the threshold over all of them in the window (None: none, or no edge above)."""
        counts = self.buckets(tick, name, window_s)
        total = counts[math.inf]
        good = good_count_at(counts, self.thresholds_s[name]) if total > 0 else None
        return None if good is None else min(1.0, max(0.0, good / total))

    def sli(self, tick: int, now_s: float) -> SliSnapshot | None:
        """Good ratios and p99s over the short window, good ratios over the burn windows."""
        by_window: dict[str, dict[str, float]] = {"ttft_le": {}, "itl_le": {}}
        for window in _SLI_BY_WINDOW:
            for name, ratios in by_window.items():
                ratio = self._good_ratio(tick, name, float(parse_duration_s(window)))
                if ratio is not None:
                    ratios[window] = ratio
        ttft = self.buckets(tick, "ttft_le", SLI_WINDOW_S)
        itl = self.buckets(tick, "itl_le", SLI_WINDOW_S)
        if ttft[math.inf] <= 0:
            return None
        ttft_by, itl_by = by_window["ttft_le"], by_window["itl_le"]
        return SliSnapshot(
            observed_at_s=now_s,
            window_s=SLI_WINDOW_S,
            requests_in_window=ttft[math.inf],
            itl_events_in_window=itl[math.inf] if SHORT_WINDOW in itl_by else None,
            ttft_good_ratio=ttft_by.get(SHORT_WINDOW),
            itl_good_ratio=itl_by.get(SHORT_WINDOW),
            ttft_p99_s=histogram_quantile(QUANTILE, ttft),
            itl_p99_s=histogram_quantile(QUANTILE, itl),
            ttft_good_ratio_by_window=ttft_by,
            itl_good_ratio_by_window=itl_by,
            prompt_tokens_buckets=self.prompt_buckets(tick, SLI_WINDOW_S),
        )


def _nan_if_none(value: float | int | None) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetView:
    """One tick's view of the fleet: the metrics pipeline, and what the orchestrator says now (no lag)."""

    pipeline: MetricsPipeline
    tick: int
    now_s: float
    spec_replicas: int
    """Replicas asked for (the workload's ``spec.replicas``; ``status.replicas`` counts the same pods)."""
    ready_replicas: int
    """Pods ready now (the orchestrator's view, ahead of any scrape)."""

    def observation(self) -> PolicyObservation:
        return self.pipeline.observation(self.tick, self.now_s, current_replicas=self.spec_replicas)
