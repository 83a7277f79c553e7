"""Experts: layer x expert load, imbalance per layer, per-rank load, placement swaps, rebalances.

The placement panels serve both engines: the embedded engine's placement API and the vLLM
plugin's trigger write ``moe_placement_swaps_total`` and friends; the balance around the last
change and the trigger's requests come from the vLLM plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery

from contracts.catalogue import (
    EXPERT_TOKENS,
    LAYER_BALANCEDNESS,
    LAYER_IMBALANCE_CV,
    LAYER_IMBALANCE_CV_NOISE,
    PLACEMENT_BALANCEDNESS,
    PLACEMENT_EXPERTS_MOVED,
    PLACEMENT_IMBALANCE_CV,
    PLACEMENT_REQUESTS,
    PLACEMENT_SWAP_DURATION_HISTOGRAM,
    PLACEMENT_SWAPS,
    RANK_TOKENS,
    REBALANCES,
    bucket,
    total,
)
from controller.policy import Policy
from generators.dashboards.panels import (
    MODEL,
    POLICY,
    RATE,
    counted_from_birth,
    grouped,
    heatmap,
    matrix_table,
    query,
    selector_value,
    timeseries,
    variables,
)


class _Slo:
    """The imbalance objective of the policies: one dashed line when they share ``max_cv``, else one per model.

    Every panel breaks its series down by ``model_name`` (``$model`` may select several), so each model's
    CV can be read against its own policy's line; a model's line shows while ``$model`` selects it.
    """

    def __init__(self, policies: Sequence[Policy]) -> None:
        self.by_model = [(model, cv) for (model, cv), _ in grouped(
            policies, lambda p: (p.model_name, p.objectives.imbalance.max_cv))]
        values = sorted({cv for _, cv in self.by_model})
        self.line = values[0] if len(values) == 1 else None
        self.text = f"{self.line}" if self.line is not None else "per model"
        self.description = f"{self.line}" if self.line is not None else ", ".join(
            f"{cv} ({model})" for model, cv in self.by_model)

    def lines(self) -> list[Dataquery]:
        if self.line is not None:
            return []
        return [query(f"vector({cv:.6g}) and on () count({LAYER_IMBALANCE_CV}"
                      f'{{{MODEL},model_name="{selector_value(model)}"}})', f"{model} SLO {cv:.6g}")
                for model, cv in self.by_model]


def build(policies: Sequence[Policy]) -> Dashboard:
    slo = _Slo(policies)
    dashboard = (
        Dashboard("moeslo / Experts").uid("moeslo-experts").tags(["moeslo", "moe", "experts"])
        .description(f"Expert-parallel load: which experts get the tokens, how evenly ranks share them "
                     f"(SLO: CV <= {slo.description} per layer), and the placement changes that fix it.")
        .refresh("30s").time("now-1h", "now").timezone("browser")
    )
    dashboard = variables(dashboard, policy=True)
    cv, noise = f"{LAYER_IMBALANCE_CV}{{{MODEL}}}", f"{LAYER_IMBALANCE_CV_NOISE}{{{MODEL}}}"
    dashboard = (
        dashboard
        .with_row(Row("Routing"))
        .with_panel(heatmap(
            "Tokens per second by layer x expert",
            query(f"sum by (model_name, layer, expert) (rate({total(EXPERT_TOKENS)}{{{MODEL}}}[{RATE}]))",
                  "{{model_name}} L{{layer}} E{{expert}}"),
            description="One row per (model, layer, expert); colour: routed tokens per second.",
        ))
        .with_panel(matrix_table(
            "Tokens routed over the range: layer x expert",
            query(f"sum by (layer, expert) (increase({total(EXPERT_TOKENS)}{{{MODEL}}}[$__range]))",
                  instant=True, table=True),
            row_field="layer", column_field="expert",
            description="Summed over the models $model selects: select one to read one model's routing.",
        ))
        .with_row(Row("Balance"))
        .with_panel(timeseries(f"Imbalance CV per layer, sampling noise out (SLO {slo.text})", [
            query(f"max by (model_name, layer) (sqrt(clamp_min(({cv} ^ 2 - {noise} ^ 2) or {cv} ^ 2, 0)))",
                  "{{model_name}} layer {{layer}}"),
            query(f"max by (model_name) ({noise})", "{{model_name}} sampling noise (largest)"),
            *slo.lines(),
        ], slo_line=slo.line, min_value=0, width=8,
            description="stddev/mean of per-rank load over the routing window, with the CV that sampling alone "
                        "gives a window of that many tokens taken out: what MoesloExpertImbalance and the "
                        "rebalancer judge (a quiet engine's raw CV sits above the line from noise alone)."))
        .with_panel(timeseries("Balancedness per layer (mean/max)", [
            query(f"min by (model_name, layer) ({LAYER_BALANCEDNESS}{{{MODEL}}})", "{{model_name}} layer {{layer}}"),
        ], unit="percentunit", min_value=0, width=8))
        .with_panel(timeseries("Assignments per second by EP rank", [
            query(f"sum by (model_name, rank) (rate({total(RANK_TOKENS)}{{{MODEL}}}[{RATE}]))",
                  "{{model_name}} rank {{rank}}"),
        ], min_value=0, stack=True, width=8))
    )
    return _placement(dashboard, slo)


def _placement(dashboard: Dashboard, slo: _Slo) -> Dashboard:
    """Placement changes (both engines), their balance and the trigger's requests (the vLLM plugin)."""
    return (
        dashboard
        .with_row(Row("Placement"))
        .with_panel(timeseries("Placement swaps and experts moved", [
            query(f"sum by (model_name) (increase({total(PLACEMENT_SWAPS)}{{{MODEL}}}[{RATE}]))",
                  "swaps {{model_name}}"),
            query(f"sum by (model_name) (increase({total(PLACEMENT_EXPERTS_MOVED)}{{{MODEL}}}[{RATE}]))",
                  "experts moved {{model_name}}"),
        ], min_value=0, width=8))
        .with_panel(timeseries("Swap duration p99", [
            query(f"histogram_quantile(0.99, sum by (model_name, le) (rate("
                  f"{bucket(PLACEMENT_SWAP_DURATION_HISTOGRAM)}{{{MODEL}}}[{RATE}])))", "p99 {{model_name}}"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("Rebalances by outcome (controller)", [
            query(f"sum by (policy, outcome) {counted_from_birth(f'{total(REBALANCES)}{{{POLICY}}}', RATE)}",
                  "{{policy}} {{outcome}}"),
        ], min_value=0, width=8))
        .with_panel(timeseries(f"Worst-layer CV around the last placement change (SLO {slo.text})", [
            query(f"max by (model_name, when, source) ({PLACEMENT_IMBALANCE_CV}{{{MODEL}}})",
                  "{{model_name}} {{source}} {{when}}"),
            *slo.lines(),
        ], slo_line=slo.line, min_value=0, width=8,
            description="vLLM plugin: predicted (the plan's load) and measured (routing counted before the change, "
                        "and after it on the new placement), before and after the last rearrangement."))
        .with_panel(timeseries("Lowest-layer balancedness around the last placement change", [
            query(f"min by (model_name, when, source) ({PLACEMENT_BALANCEDNESS}{{{MODEL}}})",
                  "{{model_name}} {{source}} {{when}}"),
        ], unit="percentunit", min_value=0, width=8))
        .with_panel(timeseries("Rebalance requests by action and outcome (vLLM plugin)", [
            query(f"sum by (model_name, action, outcome) (increase({total(PLACEMENT_REQUESTS)}{{{MODEL}}}"
                  f"[{RATE}]))", "{{model_name}} {{action}} {{outcome}}"),
        ], min_value=0, width=8,
            description="plan: dry runs; apply: rearrangements. refused: EPLB off or not allowed (HTTP 409)."))
    )
