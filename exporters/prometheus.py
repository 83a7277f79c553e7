"""Engine statistics as Prometheus metrics (the names of ``docs/metrics.md``).

:class:`PrometheusStatsSink` is a :class:`~engine.stats.StatsSink`: it only
translates :class:`~engine.stats.StepStats` into metrics.  Every metric is
created once in the constructor, in an injected registry (one per engine,
never the global one), with its ``model_name`` / ``engine`` labels bound.

Per-(layer, expert) routed-token counters are the one exception to "go
through the registry": a 58-layer x 256-expert model has 14,848 of them, and
prometheus_client's exposition formats them in about 300 ms.  They are kept
in a numpy array and rendered by :meth:`PrometheusStatsSink.render` from
a %-format template built once, in about 3 ms.  They are on by default up to
``max_expert_series`` series and off above, unless forced either way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.stats import IntArray, RoutingDelta, RoutingWindow, StepStats, balancedness, imbalance_cv
from exporters.buckets import ITL_BUCKETS_S, TTFT_BUCKETS_S

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Media type of :meth:`PrometheusStatsSink.render` (the classic text format)."""

FINISH_REASONS = ("length", "stop", "abort", "error")

# vLLM's request-latency edges (e2e, queue, prefill, decode), from vllm/v1/metrics/loggers.py.
REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
SWAP_DURATION_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

DEFAULT_MAX_EXPERT_SERIES = 4096


class PrometheusStatsSink:
    """Translate engine steps into Prometheus metrics in ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model_name: str,
        engine: str = "0",
        expert_series: bool | None = None,
        max_expert_series: int = DEFAULT_MAX_EXPERT_SERIES,
        routing_window_steps: int = 256,
    ) -> None:
        """``expert_series``: None switches per-(layer, expert) counters on up to ``max_expert_series``."""
        self.registry = registry
        self.model_name = model_name
        self.engine = engine
        self._expert_series_setting = expert_series
        self._max_expert_series = max_expert_series
        names = ["model_name", "engine"]
        values = (model_name, engine)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, registry=registry, buckets=buckets)

        self._ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS_S
        ).labels(*values)
        self._itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS_S
        ).labels(*values)
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        ).labels(*values)
        self._queue = histogram(
            "vllm:request_queue_time_seconds", "Time the request waited before it was scheduled, in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        ).labels(*values)
        self._prefill = histogram(
            "vllm:request_prefill_time_seconds", "Time from first scheduled to first token, in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        ).labels(*values)
        self._decode = histogram(
            "vllm:request_decode_time_seconds", "Time from first token to finish, in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        ).labels(*values)
        self._running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch.", names, registry=registry,
            multiprocess_mode="sum",
        ).labels(*values)
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", names, registry=registry,
            multiprocess_mode="sum",
        ).labels(*values)
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", names, registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(*values)
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens computed (recompute included).", names, registry=registry
        ).labels(*values)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", names, registry=registry
        ).labels(*values)
        self._preemptions = Counter(
            "vllm:num_preemptions", "Preemptions (recompute).", names, registry=registry
        ).labels(*values)
        success = Counter(
            "vllm:request_success", "Finished requests by finish reason.", [*names, "finished_reason"],
            registry=registry,
        )
        self._success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self._swap_duration = histogram(
            "moe_placement_swap_duration_seconds", "Wall time of one placement change, in seconds.",
            SWAP_DURATION_BUCKETS_S,
        ).labels(*values)
        self._moe = _MoECollector(model_name, engine, routing_window_steps)
        registry.register(self._moe)
        self._expert_template: tuple[tuple[int, ...], str] | None = None

    # ------------------------------------------------------------------ StatsSink

    def record(self, step: StepStats) -> None:
        self._running.set(step.num_running)
        self._waiting.set(step.num_waiting)
        self._kv_usage.set(step.kv_cache_usage)
        if step.prompt_tokens:
            self._prompt_tokens.inc(step.prompt_tokens)
        if step.generation_tokens:
            self._generation_tokens.inc(step.generation_tokens)
        if step.num_preemptions:
            self._preemptions.inc(step.num_preemptions)
        for ttft in step.ttfts_s:
            self._ttft.observe(ttft)
        for itl in step.itls_s:
            self._itl.observe(itl)
        for fin in step.finished:
            self._e2e.observe(fin.e2e_s)
            self._queue.observe(fin.queue_s)
            self._prefill.observe(fin.prefill_s)
            self._decode.observe(fin.decode_s)
            counter = self._success.get(fin.finish_reason)
            if counter is not None:
                counter.inc()
        if step.placement_swap is not None:
            self._swap_duration.observe(step.placement_swap.duration_s)
            self._moe.record_swap(step.placement_swap.experts_moved)
        if step.routing is not None:
            self._moe.record_routing(step.routing)

    # ------------------------------------------------------------------ exposition

    @property
    def expert_series_enabled(self) -> bool:
        shape = self._moe.expert_shape
        if self._expert_series_setting is not None:
            return self._expert_series_setting
        return shape is not None and shape[0] * shape[1] <= self._max_expert_series

    def expert_tokens(self) -> IntArray | None:
        """Cumulative (layers, experts) routed tokens, or None before the first routed step."""
        return self._moe.expert_totals()

    def render(self) -> bytes:
        """The ``/metrics`` body: the registry, then the per-(layer, expert) counters."""
        body = generate_latest(self.registry)
        if not self.expert_series_enabled:
            return body
        totals = self._moe.expert_totals()
        if totals is None:
            return body
        if self._expert_template is None or self._expert_template[0] != totals.shape:
            self._expert_template = (totals.shape, _expert_template(self.model_name, self.engine, *totals.shape))
        # One C-level %-format over a template built once: ~3 ms for 14,848 series.
        return body + (self._expert_template[1] % tuple(totals.ravel().tolist())).encode()


def _expert_template(model_name: str, engine: str, layers: int, experts: int) -> str:
    """The expert counter family as a %-format template with one ``%d`` per (layer, expert)."""
    base = f'moe_expert_tokens_total{{model_name="{_escape(model_name)}",engine="{_escape(engine)}"'.replace(
        "%", "%%"
    )
    header = (
        "# HELP moe_expert_tokens_total Tokens routed per (layer, logical expert).\n"
        "# TYPE moe_expert_tokens_total counter\n"
    )
    return header + "".join(
        f'{base},layer="{layer}",expert="{expert}"}} %d\n' for layer in range(layers) for expert in range(experts)
    )


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _MoECollector(Collector):
    """Expert-load families computed from numpy state when scraped (not on every step)."""

    def __init__(self, model_name: str, engine: str, window_steps: int) -> None:
        self._labels = [model_name, engine]
        self._window_steps = window_steps
        self._lock = threading.Lock()
        self._window: RoutingWindow | None = None
        self._expert_totals: IntArray | None = None
        self._rank_totals: IntArray | None = None
        self._swaps = 0
        self._experts_moved = 0

    @property
    def expert_shape(self) -> tuple[int, int] | None:
        totals = self._expert_totals
        return None if totals is None else (int(totals.shape[0]), int(totals.shape[1]))

    def record_routing(self, delta: RoutingDelta) -> None:
        expert_tokens, rank_tokens = delta.expert_tokens, delta.rank_tokens
        with self._lock:
            if self._window is None or self._expert_totals is None:
                layers, experts = expert_tokens.shape
                self._window = RoutingWindow(layers, experts, rank_tokens.shape[1], self._window_steps)
                self._expert_totals = np.zeros_like(expert_tokens, dtype=np.int64)
            if self._rank_totals is None or self._rank_totals.shape != rank_tokens.shape:
                self._rank_totals = np.zeros_like(rank_tokens, dtype=np.int64)  # EP size changed
            self._window.add(delta)
            self._expert_totals += expert_tokens
            self._rank_totals += rank_tokens

    def record_swap(self, experts_moved: int) -> None:
        with self._lock:
            self._swaps += 1
            self._experts_moved += experts_moved
            if self._window is not None:
                self._window.reset()  # loads under the old placement no longer describe the ranks

    def expert_totals(self) -> IntArray | None:
        with self._lock:
            return None if self._expert_totals is None else self._expert_totals.copy()

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with self._lock:
            rank_window = None if self._window is None else self._window.rank_tokens
            rank_totals = None if self._rank_totals is None else self._rank_totals.sum(axis=0)
            swaps, moved = self._swaps, self._experts_moved
        labels = ["model_name", "engine"]
        yield _counter("moe_placement_swaps", "Placement changes applied.", labels, [(self._labels, swaps)])
        yield _counter(
            "moe_placement_experts_moved", "Expert weights that changed rank.", labels, [(self._labels, moved)]
        )
        if rank_window is None or rank_totals is None:
            return
        cv = imbalance_cv(rank_window)
        bal = balancedness(rank_window)
        yield _gauge(
            "moe_layer_imbalance_cv", "CV (stddev/mean) of per-rank expert load over the routing window.",
            [*labels, "layer"], [([*self._labels, str(i)], float(v)) for i, v in enumerate(cv)],
        )
        yield _gauge(
            "moe_layer_balancedness", "mean/max of per-rank expert load over the routing window.",
            [*labels, "layer"], [([*self._labels, str(i)], float(v)) for i, v in enumerate(bal)],
        )
        for name, doc, per_layer in (
            ("moe_imbalance_cv_across_layers", "Min, median and max of the per-layer CV.", cv),
            ("moe_balancedness_across_layers", "Min, median and max of the per-layer balancedness.", bal),
        ):
            stats = [("min", np.min(per_layer)), ("median", np.median(per_layer)), ("max", np.max(per_layer))]
            yield _gauge(name, doc, [*labels, "stat"], [([*self._labels, s], float(v)) for s, v in stats])
        yield _counter(
            "moe_rank_tokens", "Expert assignments processed by each EP rank, all layers.", [*labels, "rank"],
            [([*self._labels, str(r)], int(v)) for r, v in enumerate(rank_totals)],
        )


def _counter(
    name: str, doc: str, labels: list[str], samples: list[tuple[list[str], float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _gauge(name: str, doc: str, labels: list[str], samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


__all__ = ["CONTENT_TYPE", "DEFAULT_MAX_EXPERT_SERIES", "PrometheusStatsSink"]
