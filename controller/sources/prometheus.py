"""SLIs from Prometheus's HTTP API (PromQL over vLLM's histograms).

One tick sends a fixed set of instant queries, each grouped ``by (model_name)``
so their number does not grow with the number of policies:

- good-event ratios at the SLO bucket edge, per window (5m ... 3d and each
  compliance window)::

      sum by (model_name, le) (increase(vllm:time_to_first_token_seconds_bucket{...}[1h]))  at le="0.5"
    / sum by (model_name)     (increase(vllm:time_to_first_token_seconds_count{...}[1h]))

  Every window of one series travels in one query, each term labelled with its
  window (``label_replace(..., "moeslo_window", "1h", "", "") or ...``): four
  queries a tick instead of one per window and series (with one HTTP client for
  the local actuator's probes, the local stack's controller CPU fell to a third);

  Every bucket is fetched, not only ``le="0.5"``: when a threshold is not a
  bucket edge (stock vLLM's ITL histogram has no 0.02 edge) the good count is
  interpolated inside the bucket that holds it, as ``histogram_quantile``
  does, instead of leaving the SLI unknown;

- p99s with ``histogram_quantile(0.99, sum by (model_name, le) (rate(..._bucket[5m])))``;
- queue, running batch, KV usage, request and token rates, engine count;
- the prefill speed of the requests finished in the SLI window: ``increase()`` of
  ``vllm:request_prompt_tokens_sum`` over that of ``vllm:request_prefill_time_seconds_sum``;
- the SLI window's peak half-minute request rate, for on/off bursts the one-minute
  rate averages away (``controller.bursts``)::

      max_over_time(sum by (model_name) (rate(vllm:request_success_total{...}[45s]))[5m:5s])

  A 45 s range holds three scrapes 30 s apart at our PodMonitors' 15 s interval, and
  two at kube-prometheus-stack's default 30 s: ``rate()`` then reads the increase over
  about 30 s either way (over the samples' span, not the range).  A 30 s range would
  hold two samples 15 s apart at 15 s, a rate over 15 s (twice as noisy as the Poisson
  allowance assumes), and none at 30 s.  The subquery's points are 5 s apart (aligned
  to the epoch, as Prometheus aligns them), so a burst shows within 5 s of its scrape;
- per-layer expert imbalance (``moe_layer_imbalance_cv``);
- when a policy's TTFT objective has a long-prompt allowance, which allowances the engines write
  ``moeslo_ttft_normalized_seconds`` for (``group by (model_name, <allowance labels>)`` of its count): a
  policy whose allowance is not among them, on a model with engines that count TTFT, gets an error naming
  the series and how to have it written (:func:`controller.ttft_series.missing_allowance_problem`);
- the entry router's queue and its refusals, for policies that name a router: one
  ``sum(moeslo_router_queued_requests{<router labels>})`` and one
  ``sum(rate(moeslo_router_requests_total{outcome="rejected",<router labels>}[1m]))``
  per distinct label set (the router's series carry no model label; its
  ``prometheus_labels`` pick it).

Prometheus down, answering with an error, or with JSON of the wrong shape (a
malformed answer): the source keeps each policy's last good observation (with
its old ``observed_at_s``, so the core sees it age into ``stale_data``) and
adds the error; it recovers on the next good answer without any reset.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import httpx

from contracts.catalogue import (
    KV_CACHE_USAGE,
    LAYER_IMBALANCE_CV,
    OUTCOME_LABEL,
    PER_1K_PROMPT_TOKENS_LABEL,
    PREFILL_TIME_HISTOGRAM,
    REFERENCE_PROMPT_TOKENS_LABEL,
    REJECTED_OUTCOME,
    REQUEST_PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    ROUTER_QUEUED,
    ROUTER_REQUESTS,
    RUNNING,
    TTFT_NORMALIZED_HISTOGRAM,
    UNSERVED_MATCHER,
    WAITING,
    total,
    ttft_events,
)
from contracts.errors import UnavailableError
from contracts.urls import redacted_url
from controller.bursts import PEAK_STEP_S
from controller.errors import malformed_answer
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
    good_count_at,
    label_matchers,
    model_matcher,
    parse_le,
    sli_series,
    ttft_key,
    windows_for,
    within,
)
from controller.ttft_series import allowance_from_labels, missing_allowance_problem
from controller.types import PolicyObservation, SliSnapshot

Vector = list[tuple[dict[str, str], float]]
WINDOW_LABEL = "moeslo_window"
"""The label a windowed query's terms carry, so one query answers for every window."""
WINDOWED_KEYS = (":good", ":total")
"""Query keys whose answer carries every window (split by :data:`WINDOW_LABEL` into ``<key>:<window>``)."""
ALLOWANCES_KEY = "ttft_allowances"
ALLOWANCE_LABELS = f"{REFERENCE_PROMPT_TOKENS_LABEL}, {PER_1K_PROMPT_TOKENS_LABEL}"
REFUSED_KEY = "router_refused"
REFUSED_MATCHER = f'{OUTCOME_LABEL}="{REJECTED_OUTCOME}"'
"""The router's 429s at admission (reject mode, or queue mode past ``--max-queue-s``)."""


class PrometheusClient:
    """Instant queries against ``/api/v1/query``; every failure is an :class:`UnavailableError`."""

    def __init__(self, base_url: str, *, timeout_s: float = 5.0, client: httpx.AsyncClient | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = f"prometheus {redacted_url(self.base_url)}"  # messages never show a user:password@
        self.timeout_s = timeout_s
        """Each query's whole answer, the client's own (per socket read) included."""
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None

    async def query(self, promql: str, *, at_unix_s: float | None = None) -> Vector:
        """An instant query, evaluated at ``at_unix_s`` (Prometheus's clock) when given."""
        form = {"query": promql}
        if at_unix_s is not None:
            form["time"] = f"{at_unix_s:.3f}"
        body = await self._post("query", form, promql)
        out: Vector = []
        with malformed_answer(self.name):
            for item in _result(body, "vector"):
                value = float(item["value"][1])
                if math.isfinite(value):
                    out.append((_labels(item["metric"]), value))
        return out

    async def query_range(
        self, promql: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range query (``/api/v1/query_range``): per series, its labels and (time, value) points."""
        form = {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
        body = await self._post("query_range", form, promql)
        with malformed_answer(self.name):
            return [
                (_labels(item["metric"]), [(float(t), float(v)) for t, v in item["values"] if math.isfinite(float(v))])
                for item in _result(body, "matrix")
            ]

    async def _post(self, endpoint: str, form: dict[str, str], promql: str) -> dict[str, Any]:
        try:
            response = await within(self._client.post(f"{self.base_url}/api/v1/{endpoint}", data=form),
                                    self.timeout_s, self.name)
        except httpx.HTTPError as exc:
            raise UnavailableError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError as exc:
            raise UnavailableError(f"{self.name}: HTTP {response.status_code}, body is not JSON") from exc
        if not isinstance(body, dict):
            raise UnavailableError(
                f"{self.name}: HTTP {response.status_code}, malformed answer "
                f"(a JSON {type(body).__name__}, not an object)"
            )
        if response.status_code != 200 or body.get("status") != "success":
            raise UnavailableError(
                f"{self.name}: HTTP {response.status_code} "
                f"{body.get('errorType', '')}: {body.get('error', '')} (query: {promql})"
            )
        return body

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _result(body: dict[str, Any], kind: str) -> list[Any]:
    """The ``data.result`` list of a ``kind`` (vector, matrix) answer; a wrong shape raises (a malformed answer)."""
    data = body.get("data", {})
    if data.get("resultType") != kind:
        raise UnavailableError(f"prometheus: expected a {kind}, got {data.get('resultType')!r}")
    result = data.get("result", [])
    if not isinstance(result, list):
        raise TypeError(f"data.result is a {type(result).__name__}, not a list")
    return result


def _labels(metric: Any) -> dict[str, str]:
    if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
        raise TypeError(f"metric {metric!r} is not an object of string labels")
    return dict(metric)


PEAK_RESOLUTION = "5s"
"""The step of the peak rate's subquery."""
PEAK_RANGE = format_duration(PEAK_STEP_S + 15.0)
"""The range of the peak rate: samples about ``PEAK_STEP_S`` apart at 15 s and at 30 s scrapes alike."""


class PrometheusSource:
    """Observations for policies from PromQL; see the module docstring."""

    def __init__(
        self,
        client: PrometheusClient,
        *,
        selector: str = "",
        rate_window_s: float = RATE_WINDOW_S,
        sli_window_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.rate_window = format_duration(rate_window_s)
        """The PromQL range of the request and token rates (whole seconds)."""
        self.sli_window = SHORT_WINDOW if sli_window_s is None else format_duration(sli_window_s)
        """The PromQL range of the SLI snapshot's good ratios, p99s, prompt lengths and prefix hits."""
        self.wall_clock = wall_clock
        self.selector = selector.strip().strip(",")
        self._last_good: dict[str, PolicyObservation] = {}

    async def aclose(self) -> None:
        await self.client.aclose()

    def _sel(self, *matchers: str) -> str:
        parts = [m for m in (*matchers, self.selector) if m]
        return "{" + ",".join(parts) + "}"

    def queries(self, policies: Sequence[Policy]) -> dict[str, str]:
        """Every PromQL query one tick sends, by key."""
        models = model_matcher([p.model_name for p in policies])
        queries: dict[str, str] = {}
        for slo, (metric, extra) in sli_series(policies).items():
            bucket_sel = count_sel = self._sel(models, extra)
            windows = windows_for(policies, self.sli_window)
            queries[f"{slo}:good"] = _by_window(
                windows, f"sum by (model_name, le) (increase({metric}_bucket{bucket_sel}[", "]))"
            )
            queries[f"{slo}:total"] = " or ".join(
                _total_events(slo, f"{metric}_count{count_sel}", self._sel(models, UNSERVED_MATCHER), w)
                for w in windows
            )
            queries[f"{slo}:p99"] = (
                f"histogram_quantile({QUANTILE}, sum by (model_name, le) "
                f"(rate({metric}_bucket{count_sel}[{self.sli_window}])))"
            )
        sel = self._sel(models)
        queries["prompt_lengths"] = (
            f"sum by (model_name, le) (increase({REQUEST_PROMPT_TOKENS_HISTOGRAM}_bucket{sel}[{self.sli_window}]))"
        )
        queries["prefix_hit_rate"] = (
            f"sum by (model_name) (increase({PREFIX_HITS_TOTAL}{sel}[{self.sli_window}])) "
            f"/ sum by (model_name) (increase({PREFIX_QUERIES_TOTAL}{sel}[{self.sli_window}]))"
        )
        queries["prefill_speed"] = (
            f"sum by (model_name) (increase({REQUEST_PROMPT_TOKENS_HISTOGRAM}_sum{sel}[{self.sli_window}])) "
            f"/ sum by (model_name) (increase({PREFILL_TIME_HISTOGRAM}_sum{sel}[{self.sli_window}]))"
        )
        queries["waiting"] = f"sum by (model_name) ({WAITING}{sel})"
        queries["running"] = f"sum by (model_name) ({RUNNING}{sel})"
        # A replica is a scrape target: a data-parallel server's page holds one series per engine.
        queries["engines"] = f"count by (model_name) (max by (model_name, instance) ({RUNNING}{sel}))"
        queries["kv"] = f"avg by (model_name) ({KV_CACHE_USAGE}{sel})"
        queries["requests"] = f"sum by (model_name) (rate({REQUESTS_TOTAL}{sel}[{self.rate_window}]))"
        queries["requests_peak"] = (
            f"max_over_time(sum by (model_name) (rate({REQUESTS_TOTAL}{sel}[{PEAK_RANGE}]))"
            f"[{self.sli_window}:{PEAK_RESOLUTION}])"
        )
        queries["prompt_tokens"] = f"sum by (model_name) (rate({PROMPT_TOKENS_TOTAL}{sel}[{self.rate_window}]))"
        queries["output_tokens"] = f"sum by (model_name) (rate({GENERATION_TOKENS_TOTAL}{sel}[{self.rate_window}]))"
        queries["imbalance"] = f"max by (model_name, layer) ({LAYER_IMBALANCE_CV}{sel})"
        if any(not p.objectives.ttft.allowance.flat for p in policies):
            written = f"{TTFT_NORMALIZED_HISTOGRAM}_count{sel}"
            queries[ALLOWANCES_KEY] = f"group by (model_name, {ALLOWANCE_LABELS}) ({written})"
        for policy in policies:
            if policy.router is not None:
                router_sel = self._sel(label_matchers(policy.router.prometheus_labels))
                queries.setdefault(_router_key(policy), f"sum({ROUTER_QUEUED}{router_sel})")
                refused_sel = self._sel(label_matchers(policy.router.prometheus_labels), REFUSED_MATCHER)
                queries.setdefault(_router_key(policy, REFUSED_KEY),
                                   f"sum(rate({total(ROUTER_REQUESTS)}{refused_sel}[{self.rate_window}]))")
        return queries

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        if not policies:
            return {}
        queries = self.queries(policies)
        # One evaluation instant for every query, so ratios of two queries (good / total) are exact.
        at_unix_s = self.wall_clock()
        answers = await asyncio.gather(
            *(self.client.query(q, at_unix_s=at_unix_s) for q in queries.values()), return_exceptions=True
        )
        results: dict[str, Vector] = {}
        errors: list[str] = []
        for key, answer in zip(queries, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, UnavailableError):
                    raise answer
                errors.append(f"{key}: {answer}")
            elif key.endswith(WINDOWED_KEYS):
                results.update(_split_windows(key, answer))
            else:
                results[key] = answer
        if len(errors) == len(queries):
            # Nothing came back: keep the last good values, let them age into stale_data.
            first = errors[0].split(": ", 1)[1]
            return {p.name: self._held(p, now_s, f"prometheus unavailable: {first}") for p in policies}
        observations = {p.name: self._observation(p, results, now_s, errors) for p in policies}
        for name, obs in observations.items():
            if not obs.errors:
                self._last_good[name] = obs
        return observations

    def _held(self, policy: Policy, now_s: float, error: str) -> PolicyObservation:
        last = self._last_good.get(policy.name)
        if last is None:
            return PolicyObservation(policy=policy.name, observed_at_s=now_s, errors=(error,))
        return replace(last, errors=(error,))

    def _observation(
        self, policy: Policy, results: Mapping[str, Vector], now_s: float, errors: Sequence[str]
    ) -> PolicyObservation:
        model = policy.model_name
        by_window: dict[str, dict[str, float]] = {"ttft": {}, "itl": {}}
        events: dict[str, float] = {}  # per SLI over its window: requests (TTFT), token gaps (ITL)
        problems = list(errors)
        for slo in HISTOGRAMS:
            threshold = getattr(policy.objectives, slo).threshold_s
            series = ttft_key(policy) if slo == "ttft" else slo
            for key in results:
                if not key.startswith(f"{series}:good:"):
                    continue
                window = key.rsplit(":", 1)[1]
                good = _good_at(results[key], model, threshold)
                total = _value(results.get(f"{series}:total:{window}"), model)
                if total is None or total <= 0:
                    continue
                if good is None:
                    problems.append(f"{series}: no finite bucket edge above {threshold} s for {model!r}")
                    break
                by_window[slo][window] = min(1.0, max(0.0, good / total))
                if window == self.sli_window:
                    events[slo] = total
        layers = _layers(results.get("imbalance", []), model)
        sli = SliSnapshot(
            observed_at_s=now_s,
            window_s=float(parse_duration_s(self.sli_window)),
            requests_in_window=events.get("ttft"),
            itl_events_in_window=events.get("itl"),
            ttft_good_ratio=by_window["ttft"].get(self.sli_window),
            itl_good_ratio=by_window["itl"].get(self.sli_window),
            ttft_p99_s=_value(results.get(f"{ttft_key(policy)}:p99"), model),
            itl_p99_s=_value(results.get("itl:p99"), model),
            ttft_good_ratio_by_window=by_window["ttft"],
            itl_good_ratio_by_window=by_window["itl"],
            imbalance_cv_per_layer=layers,
            prompt_tokens_buckets=_buckets(results.get("prompt_lengths"), model),
        )
        engines = _value(results.get("engines"), model)
        problems.extend(filter(None, [_missing_allowance(policy, results, self.sli_window)]))
        queued = _router_queued(policy, results, problems)
        return PolicyObservation(
            policy=policy.name,
            observed_at_s=now_s,
            ready_replicas=None if engines is None else int(engines),
            queue_depth=_value(results.get("waiting"), model),
            router_queued=queued,
            router_refused_rps=_router_refused(policy, results, queued),
            running_requests=_value(results.get("running"), model),
            request_rate_rps=_value(results.get("requests"), model),
            request_rate_peak_rps=_value(results.get("requests_peak"), model),
            prompt_tokens_per_s=_value(results.get("prompt_tokens"), model),
            output_tokens_per_s=_value(results.get("output_tokens"), model),
            kv_cache_usage=_value(results.get("kv"), model),
            prefix_cache_hit_rate=_value(results.get("prefix_hit_rate"), model),
            prefill_tokens_per_s=_value(results.get("prefill_speed"), model),
            sli=sli,
            errors=tuple(dict.fromkeys(problems)),
        )


def _layers(vector: Vector, model: str) -> tuple[float, ...]:
    """The model's per-layer imbalance, in layer order."""
    by_layer = sorted((int(labels["layer"]), value) for labels, value in vector
                      if labels.get("model_name") == model and labels.get("layer", "").isdecimal())  # fmt: skip
    return tuple(value for _, value in by_layer)


"""The requests without a first token the TTFT SLI counts as bad (as the generated rules do)."""


def _total_events(slo: str, count: str, unserved_sel: str, window: str) -> str:
    """One window's events of an SLI: its histogram's count, and for TTFT the requests the engines ended before a
    first token (deadline, error), which no TTFT histogram holds; ``or 0 * ...`` keeps the total where an engine
    (stock vLLM) exports no such counter (:func:`contracts.catalogue.ttft_events`, as the alert rules build it)."""
    events = f"sum by (model_name) (increase({count}[{window}]))"
    if slo.startswith("ttft"):
        unserved = f"sum by (model_name) (increase({total(REQUESTS_WITHOUT_FIRST_TOKEN)}{unserved_sel}[{window}]))"
        events = ttft_events(events, unserved)
    return f'label_replace({events}, "{WINDOW_LABEL}", "{window}", "", "")'


def _by_window(windows: Sequence[str], before: str, after: str) -> str:
    """One query for every window (``before + window + after`` each), each term labelled with its
    window and joined with ``or`` (the labels differ, so no term's series hides another's)."""
    return " or ".join(f'label_replace({before}{w}{after}, "{WINDOW_LABEL}", "{w}", "", "")' for w in windows)


def _split_windows(key: str, vector: Vector) -> dict[str, Vector]:
    """A windowed query's answer as one vector per window, keyed ``<key>:<window>``, without the window label."""
    out: dict[str, Vector] = {}
    for labels, value in vector:
        rest = {k: v for k, v in labels.items() if k != WINDOW_LABEL}
        out.setdefault(f"{key}:{labels.get(WINDOW_LABEL, '')}", []).append((rest, value))
    return out


def _missing_allowance(policy: Policy, results: Mapping[str, Vector], sli_window: str) -> str | None:
    """The policy's TTFT allowance series that the engines of its model do not write, and how to have it."""
    allowances, model = results.get(ALLOWANCES_KEY), policy.model_name
    if allowances is None or _value(results.get("engines"), model) is None:
        # No allowance asked for, or the query failed (its error is already in the problems); or no engines
        # serve the model now, whose series would linger in Prometheus after them.
        return None
    written = [a for labels, _ in allowances if labels.get("model_name") == model
               and (a := allowance_from_labels(labels)) is not None]  # fmt: skip
    served = bool(_value(results.get(f"ttft:total:{sli_window}"), model))  # now: a month's says nothing of a restart
    return missing_allowance_problem(policy.objectives.ttft.allowance, model, written, served=served)


def _router_key(policy: Policy, what: str = "router_queued") -> str:
    """The query key of a policy's router series: one per distinct label set, shared by the policies naming it."""
    labels = {} if policy.router is None else policy.router.prometheus_labels
    return f"{what}:" + ",".join(f"{name}={value!r}" for name, value in sorted(labels.items()))


def _router_queued(policy: Policy, results: Mapping[str, Vector], problems: list[str]) -> float | None:
    """The policy's router queue; None (and a problem) when its router's series are not in Prometheus."""
    if policy.router is None:
        return None
    key = _router_key(policy)
    if key not in results:
        return None  # the query failed: its error is already in the problems
    vector = results[key]
    if not vector:
        problems.append(f"router: no {ROUTER_QUEUED} series with labels {policy.router.prometheus_labels}")
        return None
    return vector[0][1]


def _router_refused(policy: Policy, results: Mapping[str, Vector], queued: float | None) -> float | None:
    """Requests/s the policy's router refused.  The counter's ``rejected`` series exists only after a first
    refusal, so no series reads as 0 once the router itself was read (its queue), and as unknown otherwise."""
    if policy.router is None or queued is None:
        return None
    vector = results.get(_router_key(policy, REFUSED_KEY))
    if vector is None:
        return None  # the query failed: its error is already in the problems
    return vector[0][1] if vector else 0.0


def _value(vector: Vector | None, model: str) -> float | None:
    if vector is None:
        return None
    for labels, value in vector:
        if labels.get("model_name") == model:
            return value
    return None


def _bucket_map(vector: Vector, model: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for labels, value in vector:
        le = parse_le(labels.get("le", ""))
        if labels.get("model_name") == model and le is not None:
            buckets[le] = buckets.get(le, 0.0) + value
    return buckets


def _good_at(vector: Vector, model: str, threshold_s: float) -> float | None:
    """Requests at or under the threshold (see :func:`good_count_at`)."""
    return good_count_at(_bucket_map(vector, model), threshold_s)


def _buckets(vector: Vector | None, model: str) -> tuple[tuple[float, float], ...]:
    """Cumulative counts by upper edge, in edge order (empty without data)."""
    return tuple(sorted(_bucket_map(vector, model).items())) if vector else ()
