"""Controller: forecast against actual load, desired and current replicas, decisions as annotations."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
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
    REFIT_DURATION_HISTOGRAM,
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
    counted_from_birth,
    decision_annotations,
    grouped,
    query,
    target_lines,
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


def _forecast(policies: Sequence[Policy]) -> TimeseriesPanel:
    """The forecast shifted by the lead time it was made for: one set of queries per distinct lead time."""
    groups = grouped(policies, lambda p: p.lead_time_s)
    forecast = FORECAST_REQUESTS_PER_SECOND
    actual = f"sum by (model_name) (rate({total(REQUEST_SUCCESS)}{{{MODEL}}}[{RATE}]))"
    targets = [query(actual, "actual {{model_name}}")]
    for lead_s, names in groups:
        # Policy names are DNS labels: nothing in them is special to a regex.
        sel = POLICY + (f',policy=~"{"|".join(names)}"' if len(groups) > 1 else "")
        targets += [query(f'{forecast}{{{sel},bound="{bound}"}} offset {lead_s}s', f"{legend} {{{{policy}}}}")
                    for bound, legend in (("point", "forecast"), ("lower", "lower"), ("upper", "upper"))]
    targets.append(query(f'{forecast}{{{POLICY},bound="sized"}}', "sized for {{policy}}"))
    made = f"{groups[0][0]} s" if len(groups) == 1 else "a lead time"
    return timeseries(f"Forecast (made {made} earlier) vs actual requests per second", targets, unit="reqps",
                      min_value=0,
                      description="The forecast one lead time ahead, shifted by the policy's lead time so it lines up "
                                  "with what happened; lower/upper: the prediction interval; sized for: the most the "
                                  "next lead time may see at the policy's quantile, unshifted (what the fleet is being "
                                  "sized for now).")  # fmt: skip


def _good_ratios(policies: Sequence[Policy]) -> list[Dataquery]:
    return [
        query(f'{SLI}{{{POLICY},sli=~".*_good_ratio"}}', "{{policy}} {{sli}}"),
        *target_lines("TTFT", policies, lambda p: p.objectives.ttft.target),
        *target_lines("ITL", policies, lambda p: p.objectives.itl.target),
    ]


def build(policies: Sequence[Policy]) -> Dashboard:
    dashboard = (
        Dashboard("moeslo / Controller").uid("moeslo-controller").tags(["moeslo", "controller"])
        .description("What the SLO controller forecast, decided and observed. Orange markers: decisions.")
        .refresh("30s").time("now-1h", "now").timezone("browser")
        .annotation(decision_annotations())
    )
    dashboard = variables(dashboard, policy=True)
    return (
        dashboard
        .with_row(Row("Load and capacity"))
        .with_panel(_forecast(policies))
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
            query(f"sum by (policy, action, reason) {counted_from_birth(f'{total(DECISIONS)}{{{POLICY}}}', RATE)}",
                  "{{policy}} {{action}}: {{reason}}"),
        ], min_value=0, stack=True, width=8))
        .with_panel(timeseries("SLIs the controller sees: p99 latency", [
            query(f'{SLI}{{{POLICY},sli=~".*_p99_seconds"}}', "{{policy}} {{sli}}"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("SLIs the controller sees: good ratios", _good_ratios(policies),
                               unit="percentunit", width=8))
        .with_row(Row("Controller health"))
        .with_panel(timeseries("Tick duration p99", [
            query(f"histogram_quantile(0.99, sum by (le) (rate({bucket(EVALUATION_DURATION_HISTOGRAM)}[{RATE}])))",
                  "p99: scrape to logged decisions"),
            query(f"histogram_quantile(0.99, sum by (le) (rate({bucket(REFIT_DURATION_HISTOGRAM)}[{RATE}])))",
                  "p99: forecast refits after it"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("Errors per second by component", [
            query(f"sum by (component) (rate({total(ERRORS)}[{RATE}]))", "{{component}}"),
        ], unit="ops", min_value=0, width=8))
        .with_panel(timeseries("Leader", [query(LEADER, "{{instance}}")], min_value=0, width=8))
    )
