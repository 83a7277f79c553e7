"""SLO overview: TTFT and ITL quantiles against the SLO, good-event ratios, budget and burn rates."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery

from contracts.catalogue import (
    BURN_RATE,
    ERROR_BUDGET_REMAINING,
    ERROR_RATIO_RECORD,
    ITL_HISTOGRAM,
    le_matcher,
)
from controller.policy import Policy, TtftObjective
from controller.slo import error_budget, standard_burn_rate_windows
from controller.ttft_series import ttft_matchers, ttft_metric
from generators.alerts.rules import rate_windows, total_events
from generators.dashboards.panels import (
    MODEL,
    POLICY,
    RATE,
    query,
    selector_value,
    stat,
    target_line,
    timeseries,
    variables,
)

QUANTILES = (0.5, 0.9, 0.99)


def _quantiles(metric: str, extra: str = "") -> list[Dataquery]:
    sel = ",".join(m for m in (MODEL, extra) if m)
    return [
        query(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{sel}}}[{RATE}])))", f"p{round(q * 100)}")
        for q in QUANTILES
    ]


def _good_ratio(metric: str, slo: str, threshold_s: float, extra: str = "", model: str = "") -> str:
    """Good events over the events the alert rules count (:func:`~generators.alerts.rules.total_events`: for TTFT
    the requests ended before a first token too), summed over the models ``$model`` (and ``model``) select."""
    sel = ",".join(m for m in (MODEL, extra) if m)
    models = ",".join(m for m in (MODEL, model) if m)
    return (
        f"sum(rate({metric}_bucket{{{sel},{le_matcher(threshold_s)}}}[{RATE}]))"
        f" / sum({total_events(metric, slo, sel, models, RATE)})"
    )


def _normalized(ttft: TtftObjective) -> str:
    """How the TTFT panels name a length-normalized TTFT (nothing for the flat objective)."""
    allowance = ttft.allowance
    if allowance.flat:
        return ""
    return (f" (minus {allowance.per_1k_prompt_tokens_s * 1000:g} ms per 1k prompt tokens beyond "
            f"{allowance.reference_prompt_tokens})")  # fmt: skip


def _recorded_burn_rates(policies: Sequence[Policy]) -> list[Dataquery]:
    """Burn rates from the alert recording rules: one query per policy, SLO and window the rules record (each
    window of the policy's alert pairs, as :func:`~generators.alerts.rules.rate_windows` picks them), each divided by
    its own budget.

    One division for every policy (``{policy=~"$policy"} / budget``) would apply one policy's budget to all.
    """
    return [
        query(
            f'{ERROR_RATIO_RECORD.format(window=window)}{{{POLICY},policy="{policy.name}",slo="{slo}"}}'
            f" / {error_budget(objective.target):.6g}",
            f"{policy.name} {slo} {window}",
        )
        for policy in policies
        for slo, objective in (("ttft", policy.objectives.ttft), ("itl", policy.objectives.itl))
        for window in rate_windows(standard_burn_rate_windows(policy.window_s))
    ]


def build(policies: Sequence[Policy]) -> Dashboard:
    """The overview: one row per policy against its own SLO, then every policy's budget and burn rates."""
    dashboard = (
        Dashboard("moeslo / SLO overview")
        .uid("moeslo-slo-overview")
        .tags(["moeslo", "slo"])
        .description(_description(policies))
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
    )
    dashboard = variables(dashboard, policy=True)
    for policy in policies:
        dashboard = _policy_row(dashboard, policy, several=len(policies) > 1)
    return _budget_row(dashboard, policies)


def _description(policies: Sequence[Policy]) -> str:
    def slo(policy: Policy) -> str:
        ttft, itl = policy.objectives.ttft, policy.objectives.itl
        # Each objective its own target, to its own digits (99.9 % is not 100 %).
        return f"TTFT <= {ttft.threshold_s} s for {ttft.target * 100:.6g}% of requests and ITL <= " \
               f"{itl.threshold_s} s for {itl.target * 100:.6g}% over {policy.window}"

    if len(policies) == 1:
        return f"{slo(policies[0])}; lines mark the SLO."
    return "; ".join(f"{p.name}: {slo(p)}" for p in policies) + "; lines mark each policy's SLO."


def _policy_row(dashboard: Dashboard, policy: Policy, *, several: bool) -> Dashboard:
    """Latency quantiles under the policy's SLO lines and its good ratios against its own targets.

    A panel draws one threshold, and policies differ in thresholds and targets: with several policies
    each gets its own row, on its own model's engines (a Grafana repeat cannot vary the thresholds).
    """
    ttft, itl = policy.objectives.ttft, policy.objectives.itl
    # Alone, the policy reads whatever $model selects; beside others, only its model tells its series apart.
    model = f'model_name="{selector_value(policy.model_name)}"' if several else ""
    ttft_extra = ",".join(m for m in (model, ttft_matchers(ttft.allowance)) if m)
    prefix = f"{policy.name}: " if several else ""
    ttft_metric_name = ttft_metric(ttft.allowance)
    return (
        dashboard.with_row(Row(f"Latency against the SLO{': ' + policy.name if several else ''}"))
        .with_panel(
            timeseries(
                f"{prefix}TTFT{_normalized(ttft)} p50 / p90 / p99 (SLO {ttft.threshold_s} s)",
                _quantiles(ttft_metric_name, ttft_extra),
                unit="s",
                slo_line=ttft.threshold_s,
                min_value=0,
                width=8,
            )
        )
        .with_panel(
            timeseries(
                f"{prefix}ITL p50 / p90 / p99 (SLO {itl.threshold_s} s)",
                _quantiles(ITL_HISTOGRAM, model),
                unit="s",
                slo_line=itl.threshold_s,
                min_value=0,
                width=8,
            )
        )
        .with_panel(
            timeseries(
                f"{prefix}Good-event ratio",
                [
                    query(_good_ratio(ttft_metric_name, "ttft", ttft.threshold_s, ttft_extra, model),
                          f"TTFT{_normalized(ttft)} <= {ttft.threshold_s} s"),
                    query(_good_ratio(ITL_HISTOGRAM, "itl", itl.threshold_s, model, model),
                          f"ITL <= {itl.threshold_s} s"),
                    target_line("TTFT", ttft.target),
                    target_line("ITL", itl.target),
                ],
                unit="percentunit",
                width=8,
                description="Share of requests (TTFT) and of token gaps (ITL) within the threshold, "
                "each with its own target; a request the engine ended before a first token (deadline, error) "
                "counts as a slow one, as in the alert rules.",
            )
        )
    )


def _budget_row(dashboard: Dashboard, policies: Sequence[Policy]) -> Dashboard:
    windows = {p.window: standard_burn_rate_windows(p.window_s) for p in policies}
    # 1x when no pair is alertable (a compliance window too short): the budget's own pace.
    slowest_alert = min([round(w.burn_rate, 3) for pairs in windows.values() for w in pairs], default=1.0)
    fastest_page = max([1.0, *(w.burn_rate for pairs in windows.values() for w in pairs)])
    thresholds_text = "; ".join(
        (f"{window}: " if len(windows) > 1 else "")
        + ", ".join(f"{w.long_window}/{w.short_window} {w.burn_rate:.3g}x" for w in pairs)
        for window, pairs in windows.items()
    )
    budget_of = policies[0].window if len(windows) == 1 else "policy's own"
    return (
        dashboard.with_row(Row("Error budget"))
        .with_panel(
            stat(
                "Error budget remaining",
                query(f"{ERROR_BUDGET_REMAINING}{{{POLICY}}}", "{{policy}} {{slo}}"),
                unit="percentunit",
                steps=[(None, "red"), (0.25, "orange"), (0.5, "green")],
                width=6,
                description=f"Share of the {budget_of} error budget left, as the controller computes it.",
            )
        )
        .with_panel(
            timeseries(
                "Burn rate (controller)",
                [query(f"{BURN_RATE}{{{POLICY}}}", "{{policy}} {{slo}} {{window}}")],
                unit="x",
                slo_line=slowest_alert,
                width=9,
                min_value=0,
                description="1x spends the budget exactly over the window; alert thresholds: " + thresholds_text,
            )
        )
        .with_panel(
            timeseries(
                "Burn rate (alert recording rules)",
                _recorded_burn_rates(policies),
                unit="x",
                slo_line=round(fastest_page, 3),
                width=9,
                min_value=0,
                description="The rates the burn-rate alerts read (moeslo-rules.yaml); line: the fastest page.",
            )
        )
    )
