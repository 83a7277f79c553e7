"""Engine: throughput, requests, queue, KV cache, preemptions, queue and end-to-end latency."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from controller.dashboards.panels import MODEL, RATE, query, timeseries, variables


def build() -> Dashboard:
    dashboard = (
        Dashboard("moeslo / Engine").uid("moeslo-engine").tags(["moeslo", "engine"])
        .description("Throughput, queue and KV cache of the serving engines (moeslo's or vLLM with the plugin).")
        .refresh("30s").time("now-1h", "now").timezone("browser")
    )
    dashboard = variables(dashboard, policy=False)
    return (
        dashboard
        .with_row(Row("Throughput"))
        .with_panel(timeseries("Tokens per second", [
            query(f"sum by (model_name) (rate(vllm:generation_tokens_total{{{MODEL}}}[{RATE}]))",
                  "generated {{model_name}}"),
            query(f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{MODEL}}}[{RATE}]))",
                  "prompt {{model_name}}"),
        ], unit="tps", min_value=0))
        .with_panel(timeseries("Finished requests per second", [
            query(f"sum by (finished_reason) (rate(vllm:request_success_total{{{MODEL}}}[{RATE}]))",
                  "{{finished_reason}}"),
        ], unit="reqps", min_value=0, stack=True))
        .with_row(Row("Queue and memory"))
        .with_panel(timeseries("Requests running and waiting", [
            query(f"sum by (model_name) (vllm:num_requests_running{{{MODEL}}})", "running {{model_name}}"),
            query(f"sum by (model_name) (vllm:num_requests_waiting{{{MODEL}}})", "waiting {{model_name}}"),
        ], min_value=0, width=8))
        .with_panel(timeseries("KV cache usage", [
            query(f"vllm:kv_cache_usage_perc{{{MODEL}}}", "{{model_name}} engine {{engine}}"),
        ], unit="percentunit", slo_line=0.9, min_value=0, width=8,
            description="Blocks in use; above the line, preemptions become likely."))
        .with_panel(timeseries("Preemptions per second", [
            query(f"sum by (model_name) (rate(vllm:num_preemptions_total{{{MODEL}}}[{RATE}]))", "{{model_name}}"),
        ], unit="ops", min_value=0, width=8))
        .with_row(Row("Request phases"))
        .with_panel(timeseries("Queue time p50 / p99", [
            query(f"histogram_quantile({q}, sum by (le) (rate(vllm:request_queue_time_seconds_bucket{{{MODEL}}}"
                  f"[{RATE}])))", f"p{round(q * 100)}")
            for q in (0.5, 0.99)
        ], unit="s", min_value=0))
        .with_panel(timeseries("End-to-end latency p50 / p99", [
            query(f"histogram_quantile({q}, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{{{MODEL}}}"
                  f"[{RATE}])))", f"p{round(q * 100)}")
            for q in (0.5, 0.99)
        ], unit="s", min_value=0))
    )
