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
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.catalogue import (
    BALANCEDNESS_ACROSS_LAYERS,
    BASE_LABELS,
    CACHE_CONFIG_INFO,
    DECODE_TIME_HISTOGRAM,
    E2E_LATENCY_HISTOGRAM,
    ENGINE_HEALTHY,
    ENGINE_LABEL,
    ENGINE_STEP_DURATION_HISTOGRAM,
    EXPERT_TOKENS,
    FINISHED_REASON_LABEL,
    GENERATION_TOKENS,
    IMBALANCE_CV_ACROSS_LAYERS,
    ITL_BUCKETS_S,
    ITL_HISTOGRAM,
    KV_CACHE_USAGE,
    LAYER_BALANCEDNESS,
    LAYER_IMBALANCE_CV,
    LAYER_IMBALANCE_CV_NOISE,
    LAYER_LABEL,
    MOE_HELP,
    PER_1K_PROMPT_TOKENS_LABEL,
    PLACEMENT_EXPERTS_MOVED,
    PLACEMENT_SWAP_DURATION_HISTOGRAM,
    PLACEMENT_SWAPS,
    PREEMPTIONS,
    PREFILL_TIME_HISTOGRAM,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    QUEUE_TIME_HISTOGRAM,
    RANK_LABEL,
    RANK_TOKENS,
    REFERENCE_PROMPT_TOKENS_LABEL,
    REQUEST_GENERATION_TOKENS_HISTOGRAM,
    REQUEST_LATENCY_BUCKETS_S,
    REQUEST_MAX_GENERATION_TOKENS_HISTOGRAM,
    REQUEST_PROMPT_TOKENS_HISTOGRAM,
    REQUEST_SUCCESS,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    RUNNING,
    SCHEDULER_CONFIG_INFO,
    STAT_LABEL,
    STEP_DURATION_BUCKETS_S,
    SWAP_DURATION_BUCKETS_S,
    TTFT_BUCKETS_S,
    TTFT_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
    WAITING,
    request_tokens_buckets,
    total,
)
from contracts.imbalance import across_layers, balancedness, imbalance_cv, sampling_noise_cv
from contracts.ttft_objective import EXPORTED_BY_DEFAULT, TtftAllowance
from engine.stats import ApiRequestStats, FinishedRequestStats, IntArray, RoutingDelta, RoutingWindow, StepStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Media type of :meth:`PrometheusStatsSink.render` (the classic text format)."""

FINISH_REASONS = ("length", "stop", "abort", "error", "deadline")

DEFAULT_MAX_EXPERT_SERIES = 4096

DEFAULT_MAX_MODEL_LEN = 32768
"""The context the per-request token histograms' edges reach when the sink is not told the model's."""
"""The long-prompt allowances ``moeslo_ttft_normalized_seconds`` has a series for."""


class _BoundMetrics:
    """Makes metrics in one registry, each with this engine's ``model_name`` / ``engine`` labels bound."""

    def __init__(self, registry: CollectorRegistry, values: tuple[str, str]) -> None:
        self.registry = registry
        self.values = values

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, BASE_LABELS, registry=self.registry, buckets=buckets).labels(*self.values)

    def gauge(self, name: str, doc: str, multiprocess_mode: Literal["sum", "mostrecent"]) -> Gauge:
        return Gauge(name, doc, BASE_LABELS, registry=self.registry,
                     multiprocess_mode=multiprocess_mode).labels(*self.values)

    def counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, BASE_LABELS, registry=self.registry).labels(*self.values)


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
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        ttft_allowances: tuple[TtftAllowance, ...] = EXPORTED_BY_DEFAULT,
    ) -> None:
        """``expert_series``: None switches per-(layer, expert) counters on up to ``max_expert_series``.

        ``max_model_len`` caps the edges of the per-request token histograms, as vLLM's do.
        """
        self.registry = registry
        self.model_name = model_name
        self.engine = engine
        self._expert_series_setting = expert_series
        self._max_expert_series = max_expert_series
        bound = _BoundMetrics(registry, (model_name, engine))
        self._ttft = bound.histogram(TTFT_HISTOGRAM, "Time to first token in seconds.", TTFT_BUCKETS_S)
        self._itl = bound.histogram(ITL_HISTOGRAM, "Inter-token latency in seconds.", ITL_BUCKETS_S)
        self._e2e = bound.histogram(E2E_LATENCY_HISTOGRAM, "End-to-end request latency in seconds.",
                                    REQUEST_LATENCY_BUCKETS_S)
        self._queue = bound.histogram(QUEUE_TIME_HISTOGRAM,
                                      "Time the request waited before it was scheduled, in seconds.",
                                      REQUEST_LATENCY_BUCKETS_S)
        self._prefill = bound.histogram(PREFILL_TIME_HISTOGRAM, "Time from first scheduled to first token, in seconds.",
                                        REQUEST_LATENCY_BUCKETS_S)
        self._decode = bound.histogram(DECODE_TIME_HISTOGRAM, "Time from first token to finish, in seconds.",
                                       REQUEST_LATENCY_BUCKETS_S)
        self._request_histograms(bound, max_model_len, ttft_allowances)
        self._step_duration = bound.histogram(ENGINE_STEP_DURATION_HISTOGRAM,
                                              "Wall time of one engine step that ran the model, in seconds.",
                                              STEP_DURATION_BUCKETS_S)
        self._running = bound.gauge(RUNNING, "Requests in the running batch.", "sum")
        self._waiting = bound.gauge(WAITING, "Requests waiting to be scheduled.", "sum")
        self._kv_usage = bound.gauge(KV_CACHE_USAGE, "Fraction of KV cache blocks in use (0..1).", "mostrecent")
        self._prompt_tokens = bound.counter(PROMPT_TOKENS, "Number of prefill tokens processed.")
        self._generation_tokens = bound.counter(GENERATION_TOKENS, "Tokens generated.")
        self._preemptions = bound.counter(PREEMPTIONS, "Preemptions (recompute).")
        self._prefix_queries = bound.counter(PREFIX_CACHE_QUERIES,
                                             "Prefix cache queries, in terms of number of queried tokens.")
        self._prefix_hits = bound.counter(PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.")
        self._success = _by_finish_reason(bound, REQUEST_SUCCESS, "Finished requests by finish reason.")
        self._without_first_token = _by_finish_reason(bound, REQUESTS_WITHOUT_FIRST_TOKEN,
                                                      "Requests ended before their first token, by finish reason.")
        self._swap_duration = bound.histogram(PLACEMENT_SWAP_DURATION_HISTOGRAM,
                                              "Wall time of one placement change, in seconds.", SWAP_DURATION_BUCKETS_S)
        self._healthy = bound.gauge(ENGINE_HEALTHY, "1 while the engine can serve, 0 once it is broken.", "mostrecent")
        self._healthy.set(1)
        self._broken = False
        # process_start_time_seconds and the rest: the restart ticket counts the start time's changes.
        ProcessCollector(registry=registry)
        self._moe = _MoECollector(model_name, engine, routing_window_steps)
        registry.register(self._moe)
        self._expert_template: tuple[tuple[int, ...], str] | None = None

    def _request_histograms(self, bound: _BoundMetrics, max_model_len: int,
                            ttft_allowances: tuple[TtftAllowance, ...]) -> None:  # fmt: skip
        """vLLM's per-request token histograms, and the TTFT normalised to each long-prompt allowance."""
        token_edges = request_tokens_buckets(max_model_len)
        self._request_prompt = bound.histogram(REQUEST_PROMPT_TOKENS_HISTOGRAM, "Number of prefill tokens processed.",
                                               token_edges)
        self._request_generation = bound.histogram(REQUEST_GENERATION_TOKENS_HISTOGRAM,
                                                   "Number of generation tokens processed.", token_edges)
        self._request_max_generation = bound.histogram(
            REQUEST_MAX_GENERATION_TOKENS_HISTOGRAM, "Histogram of maximum number of requested generation tokens.",
            token_edges)
        normalized = Histogram(TTFT_NORMALIZED_HISTOGRAM, "TTFT minus the long-prompt allowance, in seconds.",
                               [*BASE_LABELS, REFERENCE_PROMPT_TOKENS_LABEL, PER_1K_PROMPT_TOKENS_LABEL],
                               registry=bound.registry, buckets=TTFT_BUCKETS_S)  # fmt: skip
        self._ttft_normalized = [
            (allowance, normalized.labels(*bound.values, *allowance.labels().values()))
            for allowance in ttft_allowances
        ]

    # ------------------------------------------------------------------ StatsSink

    def record_engine_limits(self, *, block_size: int, num_blocks: int, max_num_seqs: int,
                             max_num_batched_tokens: int) -> None:  # fmt: skip
        """The engine's fixed limits, as labels of gauges of 1: vLLM's ``vllm:cache_config_info`` (its
        ``block_size`` and ``num_gpu_blocks``) and ours, ``moeslo_scheduler_config_info``.  ``moeslo profile``
        reads them, so a profile states the engine's KV capacity and batch limit instead of a guess."""
        Gauge(CACHE_CONFIG_INFO, "Information of the engine's KV cache configuration.",
              [ENGINE_LABEL, "block_size", "num_gpu_blocks"], registry=self.registry,
              ).labels(self.engine, str(block_size), str(num_blocks)).set(1)  # fmt: skip
        Gauge(SCHEDULER_CONFIG_INFO, "The engine's batch limits.",
              [*BASE_LABELS, "max_num_seqs", "max_num_batched_tokens"], registry=self.registry,
              ).labels(self.model_name, self.engine, str(max_num_seqs), str(max_num_batched_tokens)).set(1)  # fmt: skip

    def record_model_shape(self, *, num_layers: int, num_experts: int, num_ranks: int) -> None:
        """The model's MoE layers, experts and EP ranks, known at start: the balance gauges exist from then, NaN
        until the first routed step (as the vLLM plugin's), and the routed-token counters at 0.  Without them an
        engine that has served nothing yet (the warm-up's routing is forgotten) read as one not scraped at all."""
        self._moe.start(num_layers, num_experts, num_ranks)

    def record_health(self, broken: str | None) -> None:
        """The engine's health changed: ``broken`` says why it cannot serve (None: it can again).

        A broken engine failed every request it held: nothing runs or waits, and its KV cache holds none
        (the gauges would otherwise keep the last step's values, which the router and controller read)."""
        self._healthy.set(1 if broken is None else 0)
        self._broken = broken is not None
        if broken is not None:
            for gauge in (self._running, self._waiting, self._kv_usage):
                gauge.set(0)

    def record_failed(self, lost: Sequence[FinishedRequestStats]) -> None:
        """Requests ended by the API process, not the core (it died): counted as vLLM counts them."""
        for fin in lost:
            self._count_finish(fin)

    def record_request(self, request: ApiRequestStats) -> None:
        """One OpenAI request once every choice has ended: per prompt, the most tokens any of its choices
        generated (vLLM observes it per parent request: one prompt's ``n`` samples).  Choices failed in the API
        process are left out, as from the other per-request histograms (:meth:`record_failed`)."""
        for prompt in request.per_prompt():
            reported = [choice.stats.generation_tokens for choice in prompt if choice.reported]
            if reported:
                self._request_max_generation.observe(max(reported))

    def record(self, step: StepStats) -> None:
        if step.step_duration_s > 0:  # the core's idle reports ran no step
            self._step_duration.observe(step.step_duration_s)
        if not self._broken:  # a finish released after the core died carries the last step's load: not now's
            self._running.set(step.num_running)
            self._waiting.set(step.num_waiting)
            self._kv_usage.set(step.kv_cache_usage)
        if step.prompt_tokens:
            self._prompt_tokens.inc(step.prompt_tokens)
        if step.generation_tokens:
            self._generation_tokens.inc(step.generation_tokens)
        if step.num_preemptions:
            self._preemptions.inc(step.num_preemptions)
        if step.prefix_cache_queries:
            self._prefix_queries.inc(step.prefix_cache_queries)
        if step.prefix_cache_hits:
            self._prefix_hits.inc(step.prefix_cache_hits)
        for ttft in step.ttfts_s:
            self._ttft.observe(ttft)
        for itl in step.itls_s:
            self._itl.observe(itl)
        for fin in step.finished:
            self._e2e.observe(fin.e2e_s)
            self._queue.observe(fin.queue_s)
            self._prefill.observe(fin.prefill_s)
            self._decode.observe(fin.decode_s)
            self._request_prompt.observe(fin.prompt_tokens)
            self._request_generation.observe(fin.generation_tokens)
            if fin.response_id is None:  # a request of its own; an OpenAI request's choices: record_request
                self._request_max_generation.observe(fin.generation_tokens)
            if fin.ttft_s is not None:
                for allowance, histogram in self._ttft_normalized:
                    histogram.observe(allowance.normalized_s(fin.ttft_s, fin.prompt_tokens))
            self._count_finish(fin)
        # Routing first: counts that arrive with a swap were routed under the old placement.
        if step.routing is not None:
            self._moe.record_routing(step.routing)
        if step.placement_swap is not None:
            self._swap_duration.observe(step.placement_swap.duration_s)
            self._moe.record_swap(step.placement_swap.experts_moved)

    def _count_finish(self, fin: FinishedRequestStats) -> None:
        """By finish reason; one ended before its first token is in no TTFT histogram, so it is counted apart
        too (one failed in the API process has no TTFT, but its tokens say whether it had a first one)."""
        if (counter := self._success.get(fin.finish_reason)) is not None:
            counter.inc()
        unserved = self._without_first_token.get(fin.finish_reason)
        if unserved is not None and fin.ttft_s is None and fin.generation_tokens == 0:
            unserved.inc()

    # ------------------------------------------------------------------ exposition

    @property
    def expert_series_enabled(self) -> bool:
        shape = self._moe.expert_shape
        if self._expert_series_setting is not None:
            return self._expert_series_setting
        return shape is not None and shape[0] * shape[1] <= self._max_expert_series

    def expert_tokens(self) -> IntArray | None:
        """Cumulative (layers, experts) routed tokens, or None before the model's shape or its first routed step."""
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


def _by_finish_reason(bound: _BoundMetrics, name: str, doc: str) -> dict[str, Counter]:
    """A counter per finish reason, this engine's labels bound."""
    family = Counter(name, doc, [*BASE_LABELS, FINISHED_REASON_LABEL], registry=bound.registry)
    return {reason: family.labels(*bound.values, reason) for reason in FINISH_REASONS}


def _expert_template(model_name: str, engine: str, layers: int, experts: int) -> str:
    """The expert counter family as a %-format template with one ``%d`` per (layer, expert)."""
    base = f'{total(EXPERT_TOKENS)}{{model_name="{_escape(model_name)}",engine="{_escape(engine)}"'.replace(
        "%", "%%"
    )
    header = (
        f"# HELP {total(EXPERT_TOKENS)} {MOE_HELP[EXPERT_TOKENS]}\n"
        f"# TYPE {total(EXPERT_TOKENS)} counter\n"
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

    def start(self, layers: int, experts: int, ranks: int) -> None:
        """An empty window and zero totals of this shape, unless routing came in first."""
        with self._lock:
            if self._window is None:
                self._window = RoutingWindow(layers, experts, ranks, self._window_steps)
                self._expert_totals = np.zeros((layers, experts), dtype=np.int64)
                self._rank_totals = np.zeros((layers, ranks), dtype=np.int64)

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
            window = self._window
            rank_window = None if window is None else window.rank_tokens
            empty = window is not None and window.steps == 0
            rank_totals = None if self._rank_totals is None else self._rank_totals.sum(axis=0)
            swaps, moved = self._swaps, self._experts_moved
        labels = list(BASE_LABELS)
        yield _counter(PLACEMENT_SWAPS, "Placement changes applied.", labels, [(self._labels, swaps)])
        yield _counter(
            PLACEMENT_EXPERTS_MOVED, "Expert weights that changed rank.", labels, [(self._labels, moved)]
        )
        if rank_totals is None:
            return
        if rank_window is not None:
            yield from self._balance(rank_window, labels, empty=empty)
        yield _counter(
            RANK_TOKENS, MOE_HELP[RANK_TOKENS], [*labels, RANK_LABEL],
            [([*self._labels, str(r)], int(v)) for r, v in enumerate(rank_totals)],
        )

    def _balance(self, rank_window: IntArray, labels: list[str], *, empty: bool) -> Iterator[GaugeMetricFamily]:
        """Each layer's balance over the window, and its spread across the layers.

        An ``empty`` window (reset by a placement swap, routing on the new placement not in yet) has no balance to
        report: NaN, where its zeros read as perfectly balanced layers for as long as the engine idled.  The series
        stay (a missing one would raise the metrics-absent ticket), as on the vLLM plugin's multiprocess route;
        PromQL's aggregations skip NaN and no comparison with it holds."""
        if empty:
            cv = bal = noise = np.full(rank_window.shape[0], np.nan)
        else:
            cv = imbalance_cv(rank_window)
            bal = balancedness(rank_window)
            noise = sampling_noise_cv(rank_window.sum(axis=1), rank_window.shape[1], rank_window)
        for name, per_layer in ((LAYER_IMBALANCE_CV, cv), (LAYER_IMBALANCE_CV_NOISE, noise), (LAYER_BALANCEDNESS, bal)):
            yield _gauge(
                name, MOE_HELP[name], [*labels, LAYER_LABEL],
                [([*self._labels, str(i)], float(v)) for i, v in enumerate(per_layer)],
            )
        for name, per_layer in ((IMBALANCE_CV_ACROSS_LAYERS, cv), (BALANCEDNESS_ACROSS_LAYERS, bal)):
            stats = across_layers(per_layer).items()
            yield _gauge(name, MOE_HELP[name], [*labels, STAT_LABEL], [([*self._labels, s], v) for s, v in stats])


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
