"""Experts: layer x expert load, imbalance per layer, per-rank load, placement swaps, rebalances.

The placement panels serve both engines: the embedded engine's placement API and the vLLM
plugin's trigger write ``moe_placement_swaps_total`` and friends; the balance around the last
change and the trigger's requests come from the vLLM plugin.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

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
from generators.dashboards.panels import MODEL, POLICY, RATE, heatmap, matrix_table, query, timeseries, variables


def build(policy: Policy) -> Dashboard:
    max_cv = policy.objectives.imbalance.max_cv
    dashboard = (
        Dashboard("moeslo / Experts").uid("moeslo-experts").tags(["moeslo", "moe", "experts"])
        .description(f"Expert-parallel load: which experts get the tokens, how evenly ranks share them "
                     f"(SLO: CV <= {max_cv} per layer), and the placement changes that fix it.")
        .refresh("30s").time("now-1h", "now").timezone("browser")
    )
    dashboard = variables(dashboard, policy=True)
    cv, noise = f"{LAYER_IMBALANCE_CV}{{{MODEL}}}", f"{LAYER_IMBALANCE_CV_NOISE}{{{MODEL}}}"
    dashboard = (
        dashboard
        .with_row(Row("Routing"))
        .with_panel(heatmap(
            "Tokens per second by layer x expert",
            query(f"sum by (layer, expert) (rate({total(EXPERT_TOKENS)}{{{MODEL}}}[{RATE}]))",
                  "L{{layer}} E{{expert}}"),
            description="One row per (layer, expert); colour: routed tokens per second.",
        ))
        .with_panel(matrix_table(
            "Tokens routed over the range: layer x expert",
            query(f"sum by (layer, expert) (increase({total(EXPERT_TOKENS)}{{{MODEL}}}[$__range]))",
                  instant=True, table=True),
            row_field="layer", column_field="expert",
        ))
        .with_row(Row("Balance"))
        .with_panel(timeseries(f"Imbalance CV per layer, sampling noise out (SLO {max_cv})", [
            query(f"max by (layer) (sqrt(clamp_min(({cv} ^ 2 - {noise} ^ 2) or {cv} ^ 2, 0)))", "layer {{layer}}"),
            query(f"max({noise})", "sampling noise (largest)"),
        ], slo_line=max_cv, min_value=0, width=8,
            description="stddev/mean of per-rank load over the routing window, with the CV that sampling alone "
                        "gives a window of that many tokens taken out: what MoesloExpertImbalance and the "
                        "rebalancer judge (a quiet engine's raw CV sits above the line from noise alone)."))
        .with_panel(timeseries("Balancedness per layer (mean/max)", [
            query(f"min by (layer) ({LAYER_BALANCEDNESS}{{{MODEL}}})", "layer {{layer}}"),
        ], unit="percentunit", min_value=0, width=8))
        .with_panel(timeseries("Assignments per second by EP rank", [
            query(f"sum by (rank) (rate({total(RANK_TOKENS)}{{{MODEL}}}[{RATE}]))", "rank {{rank}}"),
        ], min_value=0, stack=True, width=8))
    )
    return _placement(dashboard, max_cv)


def _placement(dashboard: Dashboard, max_cv: float) -> Dashboard:
    """Placement changes (both engines), their balance and the trigger's requests (the vLLM plugin)."""
    return (
        dashboard
        .with_row(Row("Placement"))
        .with_panel(timeseries("Placement swaps and experts moved", [
            query(f"sum(increase({total(PLACEMENT_SWAPS)}{{{MODEL}}}[{RATE}]))", "swaps"),
            query(f"sum(increase({total(PLACEMENT_EXPERTS_MOVED)}{{{MODEL}}}[{RATE}]))", "experts moved"),
        ], min_value=0, width=8))
        .with_panel(timeseries("Swap duration p99", [
            query(f"histogram_quantile(0.99, sum by (le) (rate({bucket(PLACEMENT_SWAP_DURATION_HISTOGRAM)}"
                  f"{{{MODEL}}}[{RATE}])))", "p99"),
        ], unit="s", min_value=0, width=8))
        .with_panel(timeseries("Rebalances by outcome (controller)", [
            query(f"sum by (outcome) (increase({total(REBALANCES)}{{{POLICY}}}[{RATE}]))", "{{outcome}}"),
        ], min_value=0, width=8))
        .with_panel(timeseries(f"Worst-layer CV around the last placement change (SLO {max_cv})", [
            query(f"max by (when, source) ({PLACEMENT_IMBALANCE_CV}{{{MODEL}}})", "{{source}} {{when}}"),
        ], slo_line=max_cv, min_value=0, width=8,
            description="vLLM plugin: predicted (the plan's load) and measured (routing counted before the change, "
                        "and after it on the new placement), before and after the last rearrangement."))
        .with_panel(timeseries("Lowest-layer balancedness around the last placement change", [
            query(f"min by (when, source) ({PLACEMENT_BALANCEDNESS}{{{MODEL}}})", "{{source}} {{when}}"),
        ], unit="percentunit", min_value=0, width=8))
        .with_panel(timeseries("Rebalance requests by action and outcome (vLLM plugin)", [
            query(f"sum by (action, outcome) (increase({total(PLACEMENT_REQUESTS)}{{{MODEL}}}[{RATE}]))",
                  "{{action}} {{outcome}}"),
        ], min_value=0, width=8,
            description="plan: dry runs; apply: rearrangements. refused: EPLB off or not allowed (HTTP 409)."))
    )
