"""SLIs by scraping the engines' ``/metrics`` directly (the embedded default, no Prometheus).

Each tick scrapes every endpoint once (concurrently; each whole read is bounded by the timeout, so an
endpoint that trickles its page is that endpoint's failed scrape, not a tick that never ends),
parses the text format with ``prometheus_client.parser`` and folds the
cumulative counters into per-model *increase* accumulators, the way
Prometheus's ``increase()`` does: a counter that went down was reset (the
engine restarted) and counts from zero; an endpoint seen for the first time
is a baseline.  Good ratios over a window are then differences between two
points of that accumulator's history, so a replica that stops does not
erase what it served.

History stays bounded: every scrape is kept for the last hour, older points
are thinned to one per five minutes and keep only the counters the SLOs use.

A policy whose TTFT objective has a long-prompt allowance that an engine serving its model does not
write (``moeslo serve --ttft-allowances``, the vLLM plugin's ``MOESLO_TTFT_ALLOWANCES``) gets an error
naming the series and the engines (:func:`controller.ttft_series.missing_allowance_problem`).

A policy that names an entry router with ``endpoints`` also has each router's
``/metrics`` read once per tick, for its queue and its refusals
(:mod:`controller.sources.router_page`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import (
    KV_CACHE_USAGE,
    LAYER_IMBALANCE_CV,
    PREFILL_TIME_HISTOGRAM,
    REQUEST_PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    ROUTER_QUEUED,
    RUNNING,
    TTFT_NORMALIZED_HISTOGRAM,
    UNSERVED_FINISH_REASONS,
    WAITING,
)
from contracts.histograms import histogram_quantile
from contracts.ttft_objective import TtftAllowance
from controller.bursts import PEAK_STEP_S
from controller.policy import Policy, parse_duration_s
from controller.slo import format_duration
from controller.sources.base import (
    GENERATION_TOKENS_TOTAL,
    HISTOGRAMS,
    PREFIX_HITS_TOTAL,
    PREFIX_QUERIES_TOTAL,
    PROMPT_TOKENS_TOTAL,
    QUANTILE,
    RATE_WINDOW_S,
    REQUESTS_TOTAL,
    SHORT_WINDOW,
    LateAnswerError,
    allowance_key,
    edges_around,
    good_count_at,
    parse_le,
    ttft_key,
    windows_for,
    within,
)
from controller.sources.counters import FINE_HISTORY_S, CounterHistory, counter_peak_rate, counter_rate
from controller.sources.router_page import RefusalRates, RouterReading, parse_router_page, with_router
from controller.ttft_series import allowance_from_labels, missing_allowance_problem, writes_allowance
from controller.types import PolicyObservation, SliSnapshot

Page = TypeVar("Page")
"""What one endpoint's read gives (an engine's samples, a router's queue)."""

UNSERVED_TOTAL = f"{REQUESTS_WITHOUT_FIRST_TOKEN}_total"
UNSERVED = "unserved"
"""Requests the engines ended before a first token for a reason the TTFT SLI counts as bad (deadline, error)."""
_COUNTERS = {
    REQUESTS_TOTAL: "requests",
    PROMPT_TOKENS_TOTAL: "prompt_tokens",
    GENERATION_TOKENS_TOTAL: "output_tokens",
    PREFIX_QUERIES_TOTAL: "prefix_queries",
    PREFIX_HITS_TOTAL: "prefix_hits",
    f"{REQUEST_PROMPT_TOKENS_HISTOGRAM}_sum": "prompt_len_sum",
    f"{PREFILL_TIME_HISTOGRAM}_sum": "prefill_s_sum",
}


@dataclass
class EngineSample:
    """What one scrape of one endpoint said about one model."""

    counters: dict[str, float] = field(default_factory=dict)
    """Cumulative counters: ``ttft:le:<edge>``, ``ttft:count``, ``requests``, ..."""
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float | None = None
    imbalance_by_layer: dict[int, float] = field(default_factory=dict)
    ttft_allowances: set[TtftAllowance] = field(default_factory=set)
    """The long-prompt allowances the page has a ``moeslo_ttft_normalized_seconds`` series for."""


PROMPT_LENGTHS = "prompt_len"
"""Key prefix of the prompt-length histogram's counters."""


def _series_key(name: str, labels: Mapping[str, str]) -> str | None:
    """The counter key prefix of a latency or prompt-length histogram family (None: not one)."""
    for slo, metric in HISTOGRAMS.items():
        if name == metric:
            return slo
    if name == TTFT_NORMALIZED_HISTOGRAM:
        allowance = allowance_from_labels(labels)
        return None if allowance is None else allowance_key(allowance)
    return PROMPT_LENGTHS if name == REQUEST_PROMPT_TOKENS_HISTOGRAM else None


def parse_metrics(text: str) -> dict[str, EngineSample]:
    """Engine samples per ``model_name`` from a /metrics page (``ValueError`` if malformed).

    A data-parallel server puts one series per engine on its page: their KV usages are averaged and each
    layer keeps its worst CV, as the Prometheus source's ``avg`` and ``max`` do."""
    samples: dict[str, EngineSample] = {}
    kv_by_model: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model_name")
            if model is None:
                continue
            out = samples.setdefault(model, EngineSample())
            name, value = sample.name, float(sample.value)
            if not math.isfinite(value):
                continue  # NaN: a figure with nothing to report (a multiprocess gauge cannot be removed)
            series = _series_key(family.name, sample.labels) if name.endswith(("_bucket", "_count")) else None
            if series is not None and name.endswith("_bucket"):
                le = parse_le(sample.labels.get("le", ""))
                if le is not None:
                    key = f"{series}:le:{le!r}"
                    out.counters[key] = out.counters.get(key, 0.0) + value
            elif series is not None:
                key = f"{series}:count"
                out.counters[key] = out.counters.get(key, 0.0) + value
                if family.name == TTFT_NORMALIZED_HISTOGRAM and (allowance := allowance_from_labels(sample.labels)):
                    out.ttft_allowances.add(allowance)
            elif name in _COUNTERS:
                key = _COUNTERS[name]
                out.counters[key] = out.counters.get(key, 0.0) + value
            elif name == UNSERVED_TOTAL and sample.labels.get("finished_reason") in UNSERVED_FINISH_REASONS:
                out.counters[UNSERVED] = out.counters.get(UNSERVED, 0.0) + value
            elif name == WAITING:
                out.waiting += value
            elif name == RUNNING:
                out.running += value
            elif name == KV_CACHE_USAGE:
                kv_by_model.setdefault(model, []).append(value)
            elif name == LAYER_IMBALANCE_CV and sample.labels.get("layer", "").isdigit():
                layer = int(sample.labels["layer"])
                out.imbalance_by_layer[layer] = max(value, out.imbalance_by_layer.get(layer, value))
    for model, kv in kv_by_model.items():
        samples[model].kv_usage = sum(kv) / len(kv)
    return samples


def _router_endpoints(policy: Policy) -> tuple[str, ...]:
    return () if policy.router is None else policy.router.endpoints


def _good_ratios(
    history: CounterHistory, policy: Policy, slo: str, now_s: float, errors: list[str], sli_window: str
) -> tuple[dict[str, float], float | None]:
    """Good ratio of ``slo`` per window (the SLI window, the burn windows), and the events counted over
    the SLI window.

    The good count is read at the threshold from the bucket edges around it
    (interpolated when the threshold is not an edge); a missing edge above the
    threshold is reported in ``errors``.  Points older than an hour keep only the
    edges the thresholds used then, so after a threshold changes a window longer
    than its new edges' history has no ratio until that history covers it (not
    an error: errors hold scaling back, and this lasts as long as the window).
    """
    threshold = getattr(policy.objectives, slo).threshold_s
    series = ttft_key(policy) if slo == "ttft" else slo
    needed = edges_around(_edges(history.totals, series), threshold)
    if any(k.startswith(f"{series}:le:") for k in history.totals) and (not needed or threshold > max(needed)):
        errors.append(f"{series}: no finite bucket edge above {threshold} s for {policy.model_name!r}")
        needed = ()
    ratios: dict[str, float] = {}
    short_total: float | None = None
    for window in windows_for([policy], sli_window):
        window_s = parse_duration_s(window)
        total = history.increase(f"{series}:count", now_s, window_s)
        if total is not None and slo == "ttft":  # requests ended before a first token count as bad, as in the rules
            unserved = history.increase(UNSERVED, now_s, window_s)
            total = (total[0] + (unserved[0] if unserved else 0.0), total[1])
        deltas = {e: history.increase(f"{series}:le:{e!r}", now_s, window_s) for e in needed}
        if total is None or total[0] <= 0 or not deltas or any(d is None or d[1] < total[1] for d in deltas.values()):
            continue  # an edge kept for less of the window than the count (a new threshold): the ratio is unknown
        good_count = good_count_at({e: d[0] for e, d in deltas.items() if d is not None}, threshold)
        if good_count is None:
            continue
        ratios[window] = min(1.0, max(0.0, good_count / total[0]))
        if window == sli_window:
            short_total = total[0]
    return ratios, short_total


def _missing_allowance(policy: Policy, live: Mapping[str, EngineSample]) -> str | None:
    """The policy's TTFT allowance series that engines serving its model do not write, and how to have it."""
    allowance = policy.objectives.ttft.allowance
    # An engine that writes no TTFT allowance and has served nothing yet is not (yet) one that lacks it.
    lacking = [e for e, sample in live.items() if not writes_allowance(sample.ttft_allowances, allowance)
               and (sample.ttft_allowances or sample.counters.get("ttft:count", 0.0) > 0)]  # fmt: skip
    if allowance.flat or not lacking:
        return None
    written = (a for e in lacking for a in live[e].ttft_allowances)
    return missing_allowance_problem(allowance, policy.model_name, written, served=True,
                                     where=f" on {', '.join(lacking)}")  # fmt: skip


def _worst_cv_per_layer(live: Sequence[EngineSample]) -> dict[int, float]:
    """Per layer, the largest imbalance CV any replica reports."""
    layers: dict[int, float] = {}
    for sample in live:
        for layer, cv in sample.imbalance_by_layer.items():
            layers[layer] = max(layers.get(layer, 0.0), cv)
    return layers


EndpointsFor = Callable[[Policy], Sequence[str]]


class ScrapeSource:
    """Observations from the engines' own /metrics pages; see the module docstring."""

    def __init__(
        self,
        endpoints_for: EndpointsFor,
        *,
        timeout_s: float = 5.0,
        rate_window_s: float = RATE_WINDOW_S,
        sli_window_s: float | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoints_for = endpoints_for
        self.rate_window_s = rate_window_s
        self.timeout_s = timeout_s
        """Each endpoint's whole read, the client's own (per socket read) included."""
        self.sli_window = SHORT_WINDOW if sli_window_s is None else format_duration(sli_window_s)
        """The window of the SLI snapshot's good ratios, p99s, prompt lengths and prefix hits."""
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None
        self._last: dict[tuple[str, str], dict[str, float]] = {}
        """Last cumulative counters per (endpoint, model)."""
        self._history: dict[str, CounterHistory] = {}
        self._refusals = RefusalRates(rate_window_s)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _scrape(self, endpoint: str) -> dict[str, EngineSample]:
        url = endpoint.rstrip("/") + "/metrics"
        response = await self._client.get(url)
        response.raise_for_status()
        return parse_metrics(response.text)

    async def _scrape_router(self, endpoint: str) -> RouterReading:
        response = await self._client.get(endpoint.rstrip("/") + "/metrics")
        response.raise_for_status()
        reading = parse_router_page(response.text)
        if reading is None:
            raise ValueError(f"the page has no {ROUTER_QUEUED} series (not a moeslo router?)")
        return reading

    async def _read_routers(self, policies: Sequence[Policy], now_s: float) -> dict[str, RouterReading | str]:
        """Per router endpoint any policy names: its reading, or the error line of a failed read."""
        endpoints = sorted({e for p in policies for e in _router_endpoints(p)})
        readings, failures = await _read_all(self._scrape_router, endpoints, "router", self.timeout_s)
        for endpoint, reading in readings.items():
            self._refusals.record(endpoint, now_s, reading.refused_total)
        return {**readings, **failures}

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        if not any(p.router is not None for p in policies):
            return await self._observe_engines(policies, now_s)
        observations, readings = await asyncio.gather(self._observe_engines(policies, now_s),
                                                      self._read_routers(policies, now_s))  # fmt: skip
        return {p.name: with_router(observations[p.name], p, readings, self._refusals) for p in policies}

    async def _observe_engines(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        endpoints_by_policy = {p.name: tuple(self.endpoints_for(p)) for p in policies}
        endpoints = sorted({e for es in endpoints_by_policy.values() for e in es})
        pages, failures = await _read_all(self._scrape, endpoints, "scrape", self.timeout_s)
        max_window_s = max((parse_duration_s(w) for w in windows_for(policies, self.sli_window)), default=0)
        models = {p.model_name for p in policies}
        for model in models:
            self._accumulate(model, pages, now_s, policies, max_window_s)
        return {
            p.name: self._observation(p, endpoints_by_policy[p.name], pages, failures, now_s) for p in policies
        }

    def _accumulate(
        self,
        model: str,
        pages: Mapping[str, Mapping[str, EngineSample]],
        now_s: float,
        policies: Sequence[Policy],
        max_window_s: float,
    ) -> None:
        history = self._history.setdefault(model, CounterHistory())
        for endpoint, page in pages.items():
            sample = page.get(model)
            if sample is None:
                continue
            previous = self._last.get((endpoint, model))
            for key, value in sample.counters.items():
                history.add(key, value, None if previous is None else previous.get(key))
            self._last[(endpoint, model)] = dict(sample.counters)
        kept = {
            f"{series}:le:{edge!r}"
            for p in policies
            if p.model_name == model
            for slo, series in (("ttft", ttft_key(p)), ("itl", "itl"))
            for edge in edges_around(_edges(history.totals, series), getattr(p.objectives, slo).threshold_s)
        }

        # An SLI window beyond the fine history reads whole histograms (p99s, prompt lengths) from thinned points.
        whole = {PROMPT_LENGTHS, "itl", *(ttft_key(p) for p in policies if p.model_name == model)}
        long_sli = parse_duration_s(self.sli_window) > FINE_HISTORY_S

        def keep(key: str) -> bool:
            return ":le:" not in key or key in kept or (long_sli and key.partition(":le:")[0] in whole)

        history.record(now_s, keep, max_window_s)

    def _observation(
        self,
        policy: Policy,
        endpoints: Sequence[str],
        pages: Mapping[str, Mapping[str, EngineSample]],
        failures: Mapping[str, str],
        now_s: float,
    ) -> PolicyObservation:
        model = policy.model_name
        sli_window_s = float(parse_duration_s(self.sli_window))
        errors = [failures[e] for e in endpoints if e in failures]
        if not endpoints:
            errors.append(f"no endpoints to scrape for model {model!r}")
        live_at = {e: pages[e][model] for e in endpoints if e in pages and model in pages[e]}
        live = list(live_at.values())
        errors.extend(
            f"scrape {e}: no series with model_name={model!r}"
            for e in endpoints
            if e in pages and model not in pages[e]
        )
        errors.extend(filter(None, [_missing_allowance(policy, live_at)]))
        history = self._history.get(model, CounterHistory())
        by_window: dict[str, dict[str, float]] = {}
        requests: dict[str, float | None] = {}
        p99: dict[str, float | None] = {}
        for slo in HISTOGRAMS:
            by_window[slo], requests[slo] = _good_ratios(history, policy, slo, now_s, errors, self.sli_window)
            p99[slo] = self._quantile(history, ttft_key(policy) if slo == "ttft" else slo, now_s, sli_window_s)
        kv_values = [s.kv_usage for s in live if s.kv_usage is not None]
        layers = _worst_cv_per_layer(live)
        sli = SliSnapshot(
            observed_at_s=now_s,
            window_s=sli_window_s,
            requests_in_window=requests["ttft"],
            itl_events_in_window=requests["itl"],
            ttft_good_ratio=by_window["ttft"].get(self.sli_window),
            itl_good_ratio=by_window["itl"].get(self.sli_window),
            ttft_p99_s=p99["ttft"],
            itl_p99_s=p99["itl"],
            ttft_good_ratio_by_window=by_window["ttft"],
            itl_good_ratio_by_window=by_window["itl"],
            imbalance_cv_per_layer=tuple(layers[k] for k in sorted(layers)),
            prompt_tokens_buckets=_window_buckets(history, PROMPT_LENGTHS, now_s, sli_window_s),
        )
        return PolicyObservation(
            policy=policy.name,
            observed_at_s=now_s,
            ready_replicas=len(live),
            queue_depth=sum(s.waiting for s in live) if live else None,
            running_requests=sum(s.running for s in live) if live else None,
            request_rate_rps=counter_rate(history, "requests", now_s, self.rate_window_s),
            request_rate_peak_rps=counter_peak_rate(history, "requests", now_s, sli_window_s, PEAK_STEP_S),
            prompt_tokens_per_s=counter_rate(history, "prompt_tokens", now_s, self.rate_window_s),
            output_tokens_per_s=counter_rate(history, "output_tokens", now_s, self.rate_window_s),
            kv_cache_usage=sum(kv_values) / len(kv_values) if kv_values else None,
            prefix_cache_hit_rate=_hit_rate(history, now_s, sli_window_s),
            prefill_tokens_per_s=_prefill_speed(history, now_s, sli_window_s),
            sli=sli if live or by_window["ttft"] or by_window["itl"] else None,
            errors=tuple(errors),
        )

    @staticmethod
    def _quantile(history: CounterHistory, slo: str, now_s: float, window_s: float) -> float | None:
        buckets = dict(_window_buckets(history, slo, now_s, window_s))
        if not any(math.isinf(edge) for edge in buckets):
            return None
        return histogram_quantile(QUANTILE, buckets)


def _window_buckets(
    history: CounterHistory, series: str, now_s: float, window_s: float
) -> tuple[tuple[float, float], ...]:
    """Increase of each bucket of ``series`` over ``window_s`` (the SLI window), in edge order: only those
    covering the same span as the +Inf bucket, so the buckets stay cumulative (an edge first kept later,
    after a policy edit, covers less)."""
    deltas: dict[float, tuple[float, float]] = {}
    for key in history.totals:
        if key.startswith(f"{series}:le:"):
            delta = history.increase(key, now_s, window_s)
            if delta is not None:
                deltas[float(key.split(":")[2])] = delta
    whole = deltas.get(math.inf)
    if whole is None:
        return ()
    return tuple(sorted((edge, d[0]) for edge, d in deltas.items() if d[1] == whole[1]))


def _edges(totals: Mapping[str, float], slo: str) -> list[float]:
    prefix = f"{slo}:le:"
    return [float(key[len(prefix) :]) for key in totals if key.startswith(prefix)]


def _hit_rate(history: CounterHistory, now_s: float, window_s: float) -> float | None:
    """Prefix-cache hits over queries in the SLI window (None: the engines report no lookups)."""
    queries = history.increase("prefix_queries", now_s, window_s)
    hits = history.increase("prefix_hits", now_s, window_s)
    if queries is None or hits is None or queries[0] <= 0:
        return None
    return min(max(hits[0] / queries[0], 0.0), 1.0)


def _prefill_speed(history: CounterHistory, now_s: float, window_s: float) -> float | None:
    """Finished requests' prompt tokens over their prefill seconds in the SLI window (None: none finished)."""
    tokens = history.increase("prompt_len_sum", now_s, window_s)
    seconds = history.increase("prefill_s_sum", now_s, window_s)
    if tokens is None or seconds is None or seconds[0] <= 0 or tokens[0] <= 0:
        return None
    return tokens[0] / seconds[0]


async def _read_all(
    read: Callable[[str], Awaitable[Page]], endpoints: Sequence[str], what: str, timeout_s: float
) -> tuple[dict[str, Page], dict[str, str]]:
    """Read every endpoint at once, each for ``timeout_s`` at most: the answers, and an error line per endpoint
    that failed (HTTP, parsing, or no complete answer in time)."""
    reads = (within(read(e), timeout_s, f"{what} {e}") for e in endpoints)
    answers = await asyncio.gather(*reads, return_exceptions=True)
    ok: dict[str, Page] = {}
    failures: dict[str, str] = {}
    for endpoint, answer in zip(endpoints, answers, strict=True):
        if isinstance(answer, LateAnswerError):
            failures[endpoint] = str(answer)
        elif isinstance(answer, Exception):  # one endpoint's failure, whatever it is, is that endpoint's
            failures[endpoint] = f"{what} {endpoint}: {type(answer).__name__}: {answer}"
        elif isinstance(answer, BaseException):
            raise answer
        else:
            ok[endpoint] = answer
    return ok, failures
