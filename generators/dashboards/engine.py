"""Engine: throughput, requests, queue, KV and prefix cache, step times, preemptions, request phases, and the
entry router."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from contracts.catalogue import (
    E2E_LATENCY_HISTOGRAM,
    ENGINE_STEP_DURATION_HISTOGRAM,
    GENERATION_TOKENS,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    QUEUE_TIME_HISTOGRAM,
    REQUEST_SUCCESS,
    ROUTER_OVERHEAD_HISTOGRAM,
    ROUTER_REQUESTS,
    ROUTER_TTFT_ERROR_HISTOGRAM,
    RUNNING,
    WAITING,
    bucket,
    total,
)
from generators.dashboards.panels import MODEL, RATE, query, timeseries, variables


def with_router_row(dashboard: Dashboard) -> Dashboard:
    """Where ``moeslo route`` sent requests, how well its cost model predicted TTFT, and what it cost."""
    return (
        dashboard
        .with_row(Row("Entry router"))
        .with_panel(timeseries("Routed requests per second, by replica and outcome", [
            query(f"sum by (replica, outcome) (rate({total(ROUTER_REQUESTS)}[{RATE}]))", "{{replica}} {{outcome}}"),
        ], unit="reqps", min_value=0, stack=True, width=8,
            description="moeslo route: where requests went; rejected (429) and unavailable (503) show overload."))
        .with_panel(timeseries("TTFT prediction error p10 / p50 / p90", [
            query(f"histogram_quantile({q}, sum by (le) (rate({bucket(ROUTER_TTFT_ERROR_HISTOGRAM)}[{RATE}])))",
                  f"p{round(q * 100)}")
            for q in (0.1, 0.5, 0.9)
        ], unit="s", width=8, description="Observed minus predicted TTFT of routed streams: drift of the cost model."))
        .with_panel(timeseries("Router overhead p99", [
            query(f"histogram_quantile(0.99, sum by (le) (rate({bucket(ROUTER_OVERHEAD_HISTOGRAM)}[{RATE}])))",
                  "p99"),
        ], unit="s", min_value=0, width=8))
    )


def build() -> Dashboard:
    dashboard = (
        Dashboard("moeslo / Engine").uid("moeslo-engine").tags(["moeslo", "engine"])
        .description("Throughput, queue and KV cache of the serving engines (moeslo's or vLLM with the plugin).")
        .refresh("30s").time("now-1h", "now").timezone("browser")
    )
    dashboard = variables(dashboard, policy=False)
    return with_router_row(
        dashboard
        .with_row(Row("Throughput"))
        .with_panel(timeseries("Tokens per second", [
            query(f"sum by (model_name) (rate({total(GENERATION_TOKENS)}{{{MODEL}}}[{RATE}]))",
                  "generated {{model_name}}"),
            query(f"sum by (model_name) (rate({total(PROMPT_TOKENS)}{{{MODEL}}}[{RATE}]))",
                  "prompt {{model_name}}"),
        ], unit="tps", min_value=0, width=8))
        .with_panel(timeseries("Finished requests per second", [
            query(f"sum by (finished_reason) (rate({total(REQUEST_SUCCESS)}{{{MODEL}}}[{RATE}]))",
                  "{{finished_reason}}"),
        ], unit="reqps", min_value=0, stack=True, width=8))
        .with_panel(timeseries("Prefix cache hit rate", [
            query(f"sum by (model_name) (rate({total(PREFIX_CACHE_HITS)}{{{MODEL}}}[{RATE}])) / "
                  f"sum by (model_name) (rate({total(PREFIX_CACHE_QUERIES)}{{{MODEL}}}[{RATE}]))", "{{model_name}}"),
        ], unit="percentunit", min_value=0, width=8,
            description="Prompt tokens served from cached KV blocks, of the prompt tokens of new requests."))
        .with_row(Row("Queue and memory"))
        .with_panel(timeseries("Requests running and waiting", [
            query(f"sum by (model_name) ({RUNNING}{{{MODEL}}})", "running {{model_name}}"),
            query(f"sum by (model_name) ({WAITING}{{{MODEL}}})", "waiting {{model_name}}"),
        ], min_value=0, width=8))
        .with_panel(timeseries("KV cache usage", [
            query(f"{KV_CACHE_USAGE}{{{MODEL}}}", "{{model_name}} engine {{engine}}"),
        ], unit="percentunit", slo_line=0.9, min_value=0, width=8,
            description="Blocks in use; above the line, preemptions become likely."))
        .with_panel(timeseries("Engine step time p50 / p99", [
            query(f"histogram_quantile({q}, sum by (le, instance, engine) "
                  f"(rate({bucket(ENGINE_STEP_DURATION_HISTOGRAM)}{{{MODEL}}}[{RATE}])))",
                  f"p{round(q * 100)} {{{{instance}}}} engine {{{{engine}}}}")
            for q in (0.5, 0.99)
        ], unit="s", min_value=0, width=8,
            description="Per replica, steps that ran the model (the embedded engine; vLLM exports none). A hung "
                        "replica's line stops; a slow node's rises."))
        .with_panel(timeseries("Preemptions per second", [
            query(f"sum by (model_name) (rate({total(PREEMPTIONS)}{{{MODEL}}}[{RATE}]))", "{{model_name}}"),
        ], unit="ops", min_value=0, width=8))
        .with_row(Row("Request phases"))
        .with_panel(timeseries("Queue time p50 / p99", [
            query(f"histogram_quantile({q}, sum by (le) (rate({bucket(QUEUE_TIME_HISTOGRAM)}{{{MODEL}}}"
                  f"[{RATE}])))", f"p{round(q * 100)}")
            for q in (0.5, 0.99)
        ], unit="s", min_value=0))
        .with_panel(timeseries("End-to-end latency p50 / p99", [
            query(f"histogram_quantile({q}, sum by (le) (rate({bucket(E2E_LATENCY_HISTOGRAM)}{{{MODEL}}}"
                  f"[{RATE}])))", f"p{round(q * 100)}")
            for q in (0.5, 0.99)
        ], unit="s", min_value=0))
    )
