"""Controller: forecast against actual load, desired and current replicas, decisions as annotations."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel

from contracts.catalogue import (
    CURRENT_REPLICAS,
    DECISIONS,
    DESIRED_REPLICAS,
    ERRORS,
    EVALUATION_DURATION_HISTOGRAM,
    FORECAST_COVERAGE,
    FORECAST_RELIABLE,
    FORECAST_REQUESTS_PER_SECOND,
    FORECAST_WAPE,
    LATENCY_CORRECTION,
    LEADER,
    PROMPT_LENGTH_CV2,
    PROMPT_LENGTH_P99_OVER_MEAN,
    REQUEST_SUCCESS,
    SLI,
    bucket,
    total,
)
from controller.policy import Policy
from generators.dashboards.panels import (
    MODEL,
    POLICY,
    RATE,
    decision_annotations,
    query,
    target_line,
    timeseries,
    variables,
)


def _corrections() -> TimeseriesPanel:
    return timeseries("Capacity model: online latency corrections", [
        query(f"{LATENCY_CORRECTION}{{{POLICY}}}", "{{sli}} {{policy}}"),
    ], min_value=0, width=6,
        description="The load multiplier the model sizes with for each latency SLI (observed p99 over "
                    "predicted, smoothed over the SLI window; 1 is the profile as is). A sawtooth in step "
                    "with the replicas is a fleet chasing its own past.")  # fmt: skip


def _length_tail() -> TimeseriesPanel:
    return timeseries("Capacity model: prompt-length tail", [
        query(f"{PROMPT_LENGTH_CV2}{{{POLICY}}}", "cv² {{policy}}"),
        query(f"{PROMPT_LENGTH_P99_OVER_MEAN}{{{POLICY}}}", "p99 / mean {{policy}}"),
    ], min_value=0, width=6,
        description="The tail of vllm:request_prompt_tokens the model spreads prefill work by (read once the "
                    "SLI window holds 200 requests; the nominal tail until then).")  # fmt: skip


def build(policy: Policy) -> Dashboard:
    lead_s = policy.lead_time_s
    dashboard = (
        Dashboard("moeslo / Controller").uid("moeslo-controller").tags(["moeslo", "controller"])
        .description("What the SLO controller forecast, decided and observed. Orange markers: decisions.")
        .refresh("30s").time("now-1h", "now").timezone("browser")
        .annotation(decision_annotations())
    )
    dashboard = variables(dashboard, policy=True)
    forecast = FORECAST_REQUESTS_PER_SECOND
    return (
        dashboard
        .with_row(Row("Load and capacity"))
        .with_panel(timeseries(f"Forecast (made {lead_s} s earlier) vs actual requests per second", [
            query(f"sum(rate({total(REQUEST_SUCCESS)}{{{MODEL}}}[{RATE}]))", "actual"),
            query(f'{forecast}{{{POLICY},bound="point"}} offset {lead_s}s', "forecast {{policy}}"),
            query(f'{forecast}{{{POLICY},bound="lower"}} offset {lead_s}s', "lower {{policy}}"),
            query(f'{forecast}{{{POLICY},bound="upper"}} offset {lead_s}s', "upper {{policy}}"),
            query(f'{forecast}{{{POLICY},bound="sized"}}', "sized for {{policy}}"),
        ], unit="reqps", min_value=0,
            description="The forecast one lead time ahead, shifted by the lead time so it lines up with what "
                        "happened; lower/upper: the prediction interval; sized for: the most the next lead time "
                        "may see at the policy's quantile, unshifted (what the fleet is being sized for now)."))
        .with_panel(timeseries("Forecast quality: rolling WAPE and interval coverage", [
            query(f"{FORECAST_WAPE}{{{POLICY}}}", "WAPE {{policy}}"),
            query(f"{FORECAST_COVERAGE}{{{POLICY}}}", "coverage {{policy}}"),
            query(f"{FORECAST_RELIABLE}{{{POLICY}}}", "forecast in use {{policy}}"),
        ], unit="percentunit", min_value=0,
            description="Each forecast scored when its bin arrived. While 'forecast in use' is 0 the controller "
                        "sizes reactively (warming up, or WAPE / coverage past the policy's bounds)."))
        .with_panel(timeseries("Desired vs current replicas", [
            query(f"{DESIRED_REPLICAS}{{{POLICY}}}", "desired {{policy}}"),
            query(f"{CURRENT_REPLICAS}{{{POLICY}}}", "current {{policy}}"),
        ], min_value=0))
        .with_panel(_corrections())
        .with_panel(_length_tail())
        .with_row(Row("Decisions and SLIs"))
        .with_panel(timeseries("Decisions by action and reason", [
            query(f"sum by (action, reason) (increase({total(DECISIONS)}{{{POLICY}}}[{RATE}]))",
                  "{{action}}: {{reason}}"),
        ], min_value=0, stack=True, width=8))
        .with_panel(timeseries("SLIs the controller sees: p99 latency", [
            query(f'{SLI}{{{POLICY},sli=~".*_p99_seconds"}}', "{{policy}} {{sli}}"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("SLIs the controller sees: good ratios", [
            query(f'{SLI}{{{POLICY},sli=~".*_good_ratio"}}', "{{policy}} {{sli}}"),
            target_line("TTFT", policy.objectives.ttft.target),
            target_line("ITL", policy.objectives.itl.target),
        ], unit="percentunit", width=8))
        .with_row(Row("Controller health"))
        .with_panel(timeseries("Tick duration p99", [
            query(f"histogram_quantile(0.99, sum by (le) (rate({bucket(EVALUATION_DURATION_HISTOGRAM)}[{RATE}])))",
                  "p99"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("Errors per second by component", [
            query(f"sum by (component) (rate({total(ERRORS)}[{RATE}]))", "{{component}}"),
        ], unit="ops", min_value=0, width=8))
        .with_panel(timeseries("Leader", [query(LEADER, "{{instance}}")], min_value=0, width=8))
    )
