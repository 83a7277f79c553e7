"""The metric catalogue: every metric name, label name and histogram bucket edge moeslo writes or reads.

Exporters write these names, SLI sources query them, and the alert-rule and
dashboard generators spell them into PromQL: all from here, so they cannot
drift apart.

Bucket edges: the alert rules count "good" events from the cumulative bucket
at the SLO threshold (``le="0.5"``), so every SLO threshold must be an exact
edge of the histogram the exporter writes.  Edges are vLLM's
(``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): TTFT uses vLLM's
list unchanged (it already contains 0.5).  vLLM's ITL list starts 0.01, 0.025
and has no 0.02 edge, so ours adds 0.02 for the mission's 20 ms ITL objective;
everything else is unchanged so dashboards built for vLLM keep working.  vLLM
0.32 takes the same edges with ``--custom-histogram-buckets``
(:func:`vllm_slo_bucket_args`); every vLLM that moeslo deploys is started so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

# ---------------------------------------------------------------- metric names
# vLLM's names for what vLLM also measures (existing dashboards keep working); ``moe_`` for the
# engine's expert load, ``moeslo_`` for the controller.  Counters are named without ``_total``
# (prometheus_client adds it on exposition; use :func:`total` in queries).

TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
E2E_LATENCY_HISTOGRAM = "vllm:e2e_request_latency_seconds"
QUEUE_TIME_HISTOGRAM = "vllm:request_queue_time_seconds"
PREFILL_TIME_HISTOGRAM = "vllm:request_prefill_time_seconds"
DECODE_TIME_HISTOGRAM = "vllm:request_decode_time_seconds"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PREEMPTIONS = "vllm:num_preemptions"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
"""Prompt tokens looked up in the prefix cache (vLLM's counter)."""
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
"""Of them, tokens found cached (vLLM's counter): hits over queries is the hit rate the capacity model uses."""
REQUEST_SUCCESS = "vllm:request_success"
REQUEST_PROMPT_TOKENS_HISTOGRAM = "vllm:request_prompt_tokens"
"""Prompt tokens per finished request (vLLM's name and buckets): also the length distribution the controller
reads to count requests no fleet can serve within a long-prompt TTFT objective."""
REQUEST_GENERATION_TOKENS_HISTOGRAM = "vllm:request_generation_tokens"
REQUEST_MAX_GENERATION_TOKENS_HISTOGRAM = "vllm:request_max_num_generation_tokens"
"""Per request: the most tokens any of its choices generated (vLLM's parallel sampling; one choice: its count)."""
TTFT_NORMALIZED_HISTOGRAM = "moeslo_ttft_normalized_seconds"
"""TTFT minus the long-prompt allowance (``contracts.ttft_objective``), one series per allowance, labelled
with it: its good count at ``le=threshold_s`` is the length-aware TTFT objective's."""
REQUESTS_WITHOUT_FIRST_TOKEN = "moeslo_requests_without_first_token"
"""Requests an engine ended before their first token, by ``finished_reason``: in no TTFT histogram."""
UNSERVED_FINISH_REASONS = ("deadline", "error")
"""Of those, the ones the TTFT SLI counts as bad events: the engine failed them (their request deadline passed
while queued or in prefill, or the engine broke).  A client's abort is not the engine's failure."""
REFERENCE_PROMPT_TOKENS_LABEL = "reference_prompt_tokens"
PER_1K_PROMPT_TOKENS_LABEL = "per_1k_prompt_tokens_s"

EXPERT_TOKENS = "moe_expert_tokens"
RANK_TOKENS = "moe_rank_tokens"
LAYER_IMBALANCE_CV = "moe_layer_imbalance_cv"
LAYER_BALANCEDNESS = "moe_layer_balancedness"
LAYER_IMBALANCE_CV_NOISE = "moe_layer_imbalance_cv_noise_floor"
IMBALANCE_CV_ACROSS_LAYERS = "moe_imbalance_cv_across_layers"
BALANCEDNESS_ACROSS_LAYERS = "moe_balancedness_across_layers"
PLACEMENT_SWAPS = "moe_placement_swaps"
ENGINE_STEP_DURATION_HISTOGRAM = "moeslo_engine_step_duration_seconds"
"""Wall time of each embedded-engine step that ran the model (vLLM exports no such series)."""
ENGINE_HEALTHY = "moe_engine_healthy"
"""1 while the embedded engine can serve, 0 once it is broken (a dead EP rank, a failed step, the core gone)."""
PLACEMENT_EXPERTS_MOVED = "moe_placement_experts_moved"
PLACEMENT_SWAP_DURATION_HISTOGRAM = "moe_placement_swap_duration_seconds"
PLACEMENT_REQUESTS = "moe_placement_requests"
PLACEMENT_IMBALANCE_CV = "moe_placement_imbalance_cv"
PLACEMENT_BALANCEDNESS = "moe_placement_balancedness"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""vLLM's KV cache configuration as labels of a gauge of 1: ``block_size`` x ``num_gpu_blocks`` is the KV
capacity in tokens (the embedded engine writes the same)."""
SCHEDULER_CONFIG_INFO = "moeslo_scheduler_config_info"
"""The embedded engine's batch limits as labels of a gauge of 1 (``max_num_seqs``, ``max_num_batched_tokens``);
vLLM exports none."""

DESIRED_REPLICAS = "moeslo_desired_replicas"
CURRENT_REPLICAS = "moeslo_current_replicas"
DECISIONS = "moeslo_decisions"
SLI = "moeslo_sli"
ERROR_BUDGET_REMAINING = "moeslo_error_budget_remaining"
BURN_RATE = "moeslo_burn_rate"
EVALUATION_DURATION_HISTOGRAM = "moeslo_evaluation_duration_seconds"
REFIT_DURATION_HISTOGRAM = "moeslo_forecast_refit_duration_seconds"
ERRORS = "moeslo_errors"
LEADER = "moeslo_leader"
REBALANCES = "moeslo_rebalances"
FORECAST_REQUESTS_PER_SECOND = "moeslo_forecast_requests_per_second"
FORECAST_TOKENS_PER_SECOND = "moeslo_forecast_tokens_per_second"
FORECAST_WAPE = "moeslo_forecast_wape"
FORECAST_COVERAGE = "moeslo_forecast_interval_coverage"
FORECAST_RELIABLE = "moeslo_forecast_reliable"
FORECAST_HISTORY = "moeslo_forecast_history_seconds"
HOST_REPLICA_BUDGET = "moeslo_replica_budget"
TTFT_INFEASIBLE_SHARE = "moeslo_ttft_infeasible_share"
TTFT_INFEASIBLE_REQUESTS = "moeslo_ttft_infeasible_requests"
PROMPT_LENGTH_CV2 = "moeslo_capacity_prompt_length_cv2"
PROMPT_LENGTH_P99_OVER_MEAN = "moeslo_capacity_prompt_length_p99_over_mean"
LATENCY_CORRECTION = "moeslo_capacity_latency_correction"
ROUTER_REQUESTS = "moeslo_router_requests"
ROUTER_PREDICTED_TTFT_HISTOGRAM = "moeslo_router_predicted_ttft_seconds"
ROUTER_OBSERVED_TTFT_HISTOGRAM = "moeslo_router_observed_ttft_seconds"
ROUTER_TTFT_ERROR_HISTOGRAM = "moeslo_router_ttft_prediction_error_seconds"
ROUTER_OVERHEAD_HISTOGRAM = "moeslo_router_overhead_seconds"
ROUTER_OUTSTANDING = "moeslo_router_outstanding_requests"
ROUTER_REPLICA_HEALTHY = "moeslo_router_replica_healthy"
ROUTER_EJECTIONS = "moeslo_router_ejections"
ROUTER_QUEUED = "moeslo_router_queued_requests"
ROUTER_QUEUE_WAIT_HISTOGRAM = "moeslo_router_queue_wait_seconds"
"""The entry router's series (``router/metrics.py``)."""

OTEL_TTFT_HISTOGRAM = "gen_ai.server.time_to_first_token"
OTEL_TIME_PER_OUTPUT_TOKEN_HISTOGRAM = "gen_ai.server.time_per_output_token"
OTEL_REQUEST_DURATION_HISTOGRAM = "gen_ai.server.request.duration"
"""OpenTelemetry: the GenAI semantic conventions' server histograms."""

GOOD_EVENTS_RECORD = "moeslo:slo_good_events:rate{window}"
TOTAL_EVENTS_RECORD = "moeslo:slo_total_events:rate{window}"
ERROR_RATIO_RECORD = "moeslo:slo_error_ratio:rate{window}"
"""Recording rules of the generated alerts (``{window}``: ``5m``, ``1h``, ...); dashboards read them too."""

MOE_HELP: dict[str, str] = {
    EXPERT_TOKENS: "Tokens routed per (layer, logical expert).",
    RANK_TOKENS: "Expert assignments processed by each EP rank, all layers.",
    LAYER_IMBALANCE_CV: "CV (stddev/mean) of per-rank expert load over the routing window.",
    LAYER_BALANCEDNESS: "mean/max of per-rank expert load over the routing window.",
    LAYER_IMBALANCE_CV_NOISE: "CV that sampling alone gives the window's routed assignments "
    "(multinomial routing at the measured rank shares): a measured CV within it is noise.",
    IMBALANCE_CV_ACROSS_LAYERS: "Min, median and max of the per-layer CV.",
    BALANCEDNESS_ACROSS_LAYERS: "Min, median and max of the per-layer balancedness.",
}
"""Help text of the ``moe_*`` series both the embedded engine and the vLLM plugin write."""

PLACEMENT_HELP: dict[str, str] = {
    PLACEMENT_SWAPS: "Placement changes applied.",
    PLACEMENT_EXPERTS_MOVED: "Expert weights that changed rank.",
    PLACEMENT_SWAP_DURATION_HISTOGRAM: "Wall time of one placement change.",
    PLACEMENT_REQUESTS: "Rebalance requests (dry runs and rearrangements) by outcome.",
    PLACEMENT_IMBALANCE_CV: "Worst-layer CV of per-rank load around the last placement change.",
    PLACEMENT_BALANCEDNESS: "Lowest-layer balancedness (mean/max) of per-rank load around the last placement change.",
}
"""Help text of the placement series (the vLLM plugin's rebalances; the engine writes the first three too)."""

# ----------------------------------------------------------------- label names

MODEL_LABEL = "model_name"
ENGINE_LABEL = "engine"
LAYER_LABEL = "layer"
EXPERT_LABEL = "expert"
RANK_LABEL = "rank"
STAT_LABEL = "stat"
FINISHED_REASON_LABEL = "finished_reason"
ACTION_LABEL = "action"
OUTCOME_LABEL = "outcome"
REJECTED_OUTCOME = "rejected"
"""The router's ``outcome`` of a request refused at admission (429 + Retry-After)."""
WHEN_LABEL = "when"
SOURCE_LABEL = "source"
REPLICA_LABEL = "replica"
DECISION_LABEL = "decision"
BASE_LABELS: tuple[str, str] = (MODEL_LABEL, ENGINE_LABEL)
"""On every engine series (embedded engine and vLLM plugin alike)."""


def total(counter: str) -> str:
    """The exposed name of a counter (``vllm:prompt_tokens`` -> ``vllm:prompt_tokens_total``)."""
    return f"{counter}_total"


UNSERVED_MATCHER = f'finished_reason=~"{"|".join(UNSERVED_FINISH_REASONS)}"'
"""The label matcher that selects :data:`UNSERVED_FINISH_REASONS` in :data:`REQUESTS_WITHOUT_FIRST_TOKEN`."""


def ttft_events(count: str, unserved: str) -> str:
    """The TTFT SLI's events in PromQL: ``count`` (the histogram's count, summed by model) plus ``unserved`` (the
    requests the engines ended before a first token, summed the same way), which no TTFT histogram holds.

    ``or 0 * count`` keeps the total where an engine (stock vLLM) exports no such counter.  The alert rules, the
    SLO dashboard and the controller's Prometheus source all build their TTFT totals here."""
    return f"{count}\n+ ({unserved} or 0 * {count})"


def bucket(histogram: str) -> str:
    """The ``_bucket`` series of a histogram."""
    return f"{histogram}_bucket"


# -------------------------------------------------------------- histogram edges

VLLM_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` edges."""

VLLM_ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` edges (no 0.02)."""

TTFT_BUCKETS_S: tuple[float, ...] = tuple(sorted({*VLLM_TTFT_BUCKETS_S, 0.3, 0.35, 0.4, 0.45, 0.55, 0.6}))
"""Edges moeslo's exporter uses for ``vllm:time_to_first_token_seconds`` (and the normalized TTFT): vLLM's plus
edges every 50 ms from 0.3 to 0.6 s, around the 500 ms objective, for the reason of :data:`ITL_BUCKETS_S`: with
vLLM's 0.25-0.5 s bucket, ours on the replay's Azure code trace (60 s start-ups, +20 %) took 6.7x the oracle's
replica-hours at its attainment, 2.6x with these."""

ITL_BUCKETS_S: tuple[float, ...] = tuple(sorted({*VLLM_ITL_BUCKETS_S, 0.0125, 0.015, 0.0175, 0.02, 0.0225}))
"""Edges moeslo's exporter uses for ``vllm:inter_token_latency_seconds``: vLLM's plus 0.02 (the objective) and
edges every 2.5 ms around it.  ``histogram_quantile`` spreads a bucket's gaps evenly, so with vLLM's 10-25 ms
bucket a p99 of token gaps that are mostly 15-17 ms read near 25 ms, and the capacity model corrected by it
bought 13-34 % more replica-hours in the replay than the exact p99 did; with these edges it is within 2 %."""

REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's request-latency edges (e2e, queue, prefill, decode), from vllm/v1/metrics/loggers.py."""

def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's edges of the per-request token histograms: 1, 2, 5, 10, 20, 50, ... up to ``max_model_len``.

    (``build_1_2_5_buckets`` in vllm/v1/metrics/buckets.py, the ``request_tokens`` family.)
    """
    edges: list[float] = []
    power = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * power > max_model_len:
                return tuple(edges)
            edges.append(mantissa * power)
        power *= 10


PROMPT_TOKENS_BUCKETS: tuple[float, ...] = request_tokens_buckets(1_000_000)
"""vLLM's 1-2-5 edges of ``vllm:request_prompt_tokens`` to a million tokens (an engine stops at its
``max_model_len``): the replay's simulated length histogram."""

STEP_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
"""Edges of ``moeslo_engine_step_duration_seconds``: a decode step near the 20 ms ITL objective in detail, a long
prefill or a stuck collective up to 10 s."""
SWAP_DURATION_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Edges of ``moe_placement_swap_duration_seconds``."""

EVALUATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Edges of ``moeslo_evaluation_duration_seconds`` (one controller tick) and of
``moeslo_forecast_refit_duration_seconds`` (the forecast refits after it)."""

ROUTER_OVERHEAD_BUCKETS_S: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
"""Edges of ``moeslo_router_overhead_seconds`` (the 1 ms goal is an edge)."""

ROUTER_TTFT_ERROR_BUCKETS_S: tuple[float, ...] = (
    -10.0, -2.5, -1.0, -0.5, -0.25, -0.1, -0.05, -0.01, 0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)  # fmt: skip
"""Edges of ``moeslo_router_ttft_prediction_error_seconds`` (observed - predicted, signed)."""

BUCKETS_BY_METRIC: dict[str, tuple[float, ...]] = {
    TTFT_HISTOGRAM: TTFT_BUCKETS_S,
    TTFT_NORMALIZED_HISTOGRAM: TTFT_BUCKETS_S,
    ITL_HISTOGRAM: ITL_BUCKETS_S,
}
"""The edges moeslo's exporter writes, by histogram name."""

VLLM_BUCKETS_BY_METRIC: dict[str, tuple[float, ...]] = {
    TTFT_HISTOGRAM: VLLM_TTFT_BUCKETS_S,
    ITL_HISTOGRAM: VLLM_ITL_BUCKETS_S,
}
"""The edges a stock vLLM server writes (the moeslo plugin leaves its histograms alone)."""

VLLM_BUCKET_FAMILIES: dict[str, str] = {
    TTFT_HISTOGRAM: "time_to_first_token",
    ITL_HISTOGRAM: "inter_token_latency",
}
"""The ``--custom-histogram-buckets`` family key (vLLM 0.32, ``vllm/v1/metrics/buckets.py``) of each SLO histogram."""

VLLM_SLO_CUSTOM_BUCKETS: dict[str, tuple[float, ...]] = {
    "time_to_first_token": TTFT_BUCKETS_S,
    "inter_token_latency": ITL_BUCKETS_S,
}
"""What vLLM must be started with so every SLO threshold is an edge and its p99s read as ours do: our TTFT and
ITL edges (vLLM's plus the edges around the objectives)."""

VLLM_CUSTOM_BUCKETS_FLAG = "--custom-histogram-buckets"


def vllm_custom_buckets_json(custom: Mapping[str, Sequence[float]] = VLLM_SLO_CUSTOM_BUCKETS) -> str:
    """The flag's value: compact JSON, one shell word (``{"inter_token_latency":[0.01,0.02,...]}``)."""
    return json.dumps({family: list(edges) for family, edges in custom.items()}, separators=(",", ":"))


def vllm_slo_bucket_args() -> list[str]:
    """vLLM flags that put every SLO threshold (the 20 ms ITL too) on a bucket edge, as our engine does."""
    return [VLLM_CUSTOM_BUCKETS_FLAG, vllm_custom_buckets_json()]


def vllm_buckets_by_metric(custom: Mapping[str, Sequence[float]] | None = None) -> dict[str, tuple[float, ...]]:
    """The edges a vLLM server writes for the SLO histograms, given its ``--custom-histogram-buckets``.

    A family present in ``custom`` replaces vLLM's defaults for that histogram, as vLLM does.
    """
    custom = custom or {}
    return {
        metric: tuple(float(edge) for edge in custom[family]) if family in custom else VLLM_BUCKETS_BY_METRIC[metric]
        for metric, family in VLLM_BUCKET_FAMILIES.items()
    }



def format_le(edge_s: float) -> str:
    """The ``le`` label value prometheus_client writes for an edge (``0.5``, ``1.0``, ``2560.0``)."""
    return repr(float(edge_s))


def le_matcher(edge_s: float) -> str:
    """A PromQL matcher for the bucket at ``edge_s``.

    Python clients write whole edges as ``1.0``, Go clients as ``1``; Prometheus 2
    keeps the label as written, so whole edges match both spellings.
    """
    text = format_le(edge_s)
    if text.endswith(".0"):
        return f'le=~"{text[:-2]}|{text[:-2]}\\\\.0"'
    return f'le="{text}"'


def is_bucket_edge(threshold_s: float, edges_s: Sequence[float]) -> bool:
    """True when ``threshold_s`` equals one of ``edges_s`` exactly (as the ``le`` label would)."""
    return any(format_le(edge) == format_le(threshold_s) for edge in edges_s)


def nearest_edges(value_s: float, edges_s: Sequence[float]) -> tuple[float | None, float | None]:
    """The largest edge below ``value_s`` and the smallest above it (None where there is none)."""
    below = [edge for edge in edges_s if edge < value_s]
    above = [edge for edge in edges_s if edge > value_s]
    return (max(below) if below else None, min(above) if above else None)


__all__ = [
    "ACTION_LABEL",
    "BALANCEDNESS_ACROSS_LAYERS",
    "BASE_LABELS",
    "BUCKETS_BY_METRIC",
    "BURN_RATE",
    "CACHE_CONFIG_INFO",
    "CURRENT_REPLICAS",
    "DECISIONS",
    "DECISION_LABEL",
    "DECODE_TIME_HISTOGRAM",
    "DESIRED_REPLICAS",
    "E2E_LATENCY_HISTOGRAM",
    "ENGINE_HEALTHY",
    "ENGINE_LABEL",
    "ENGINE_STEP_DURATION_HISTOGRAM",
    "ERRORS",
    "ERROR_BUDGET_REMAINING",
    "ERROR_RATIO_RECORD",
    "EVALUATION_BUCKETS_S",
    "EVALUATION_DURATION_HISTOGRAM",
    "EXPERT_LABEL",
    "EXPERT_TOKENS",
    "FINISHED_REASON_LABEL",
    "FORECAST_COVERAGE",
    "FORECAST_HISTORY",
    "FORECAST_RELIABLE",
    "FORECAST_REQUESTS_PER_SECOND",
    "FORECAST_TOKENS_PER_SECOND",
    "FORECAST_WAPE",
    "GENERATION_TOKENS",
    "GOOD_EVENTS_RECORD",
    "HOST_REPLICA_BUDGET",
    "IMBALANCE_CV_ACROSS_LAYERS",
    "ITL_BUCKETS_S",
    "ITL_HISTOGRAM",
    "KV_CACHE_USAGE",
    "LATENCY_CORRECTION",
    "LAYER_BALANCEDNESS",
    "LAYER_IMBALANCE_CV",
    "LAYER_IMBALANCE_CV_NOISE",
    "LAYER_LABEL",
    "LEADER",
    "MODEL_LABEL",
    "MOE_HELP",
    "OTEL_REQUEST_DURATION_HISTOGRAM",
    "OTEL_TIME_PER_OUTPUT_TOKEN_HISTOGRAM",
    "OTEL_TTFT_HISTOGRAM",
    "OUTCOME_LABEL",
    "PER_1K_PROMPT_TOKENS_LABEL",
    "PLACEMENT_BALANCEDNESS",
    "PLACEMENT_EXPERTS_MOVED",
    "PLACEMENT_HELP",
    "PLACEMENT_IMBALANCE_CV",
    "PLACEMENT_REQUESTS",
    "PLACEMENT_SWAPS",
    "PLACEMENT_SWAP_DURATION_HISTOGRAM",
    "PREEMPTIONS",
    "PREFILL_TIME_HISTOGRAM",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_QUERIES",
    "PROMPT_LENGTH_CV2",
    "PROMPT_LENGTH_P99_OVER_MEAN",
    "PROMPT_TOKENS",
    "PROMPT_TOKENS_BUCKETS",
    "QUEUE_TIME_HISTOGRAM",
    "RANK_LABEL",
    "RANK_TOKENS",
    "REBALANCES",
    "REFERENCE_PROMPT_TOKENS_LABEL",
    "REFIT_DURATION_HISTOGRAM",
    "REJECTED_OUTCOME",
    "REPLICA_LABEL",
    "REQUESTS_WITHOUT_FIRST_TOKEN",
    "REQUEST_LATENCY_BUCKETS_S",
    "REQUEST_SUCCESS",
    "ROUTER_EJECTIONS",
    "ROUTER_OBSERVED_TTFT_HISTOGRAM",
    "ROUTER_OUTSTANDING",
    "ROUTER_OVERHEAD_BUCKETS_S",
    "ROUTER_OVERHEAD_HISTOGRAM",
    "ROUTER_PREDICTED_TTFT_HISTOGRAM",
    "ROUTER_QUEUED",
    "ROUTER_REPLICA_HEALTHY",
    "ROUTER_REQUESTS",
    "ROUTER_TTFT_ERROR_BUCKETS_S",
    "ROUTER_TTFT_ERROR_HISTOGRAM",
    "RUNNING",
    "SCHEDULER_CONFIG_INFO",
    "SLI",
    "SOURCE_LABEL",
    "STAT_LABEL",
    "STEP_DURATION_BUCKETS_S",
    "SWAP_DURATION_BUCKETS_S",
    "TOTAL_EVENTS_RECORD",
    "TTFT_BUCKETS_S",
    "TTFT_HISTOGRAM",
    "TTFT_INFEASIBLE_REQUESTS",
    "TTFT_INFEASIBLE_SHARE",
    "TTFT_NORMALIZED_HISTOGRAM",
    "UNSERVED_FINISH_REASONS",
    "UNSERVED_MATCHER",
    "VLLM_BUCKETS_BY_METRIC",
    "VLLM_BUCKET_FAMILIES",
    "VLLM_CUSTOM_BUCKETS_FLAG",
    "VLLM_ITL_BUCKETS_S",
    "VLLM_SLO_CUSTOM_BUCKETS",
    "VLLM_TTFT_BUCKETS_S",
    "WAITING",
    "WHEN_LABEL",
    "bucket",
    "format_le",
    "is_bucket_edge",
    "le_matcher",
    "nearest_edges",
    "total",
    "ttft_events",
    "vllm_buckets_by_metric",
    "vllm_custom_buckets_json",
    "vllm_slo_bucket_args",
]
