"""SLO policies -> Prometheus recording and alerting rules (pure: no I/O).

For each policy and each latency objective (TTFT, ITL) the generator records
good and total event rates from the histogram bucket at the SLO threshold
over every window the burn-rate alerts read, then the error ratio.  The
alerts are the SRE workbook's multiwindow multi-burn-rate alerts; their
window pairs and burn-rate factors come from :mod:`controller.slo`, derived
from the policy's compliance window and the share of budget each alert
guards, so a 7-day window gets different factors than a 30-day one.  The
slowest pair (3d/6h) always tickets above 1x, so a burn that would exhaust the
budget within the window is never silent; faster pairs whose factor would be
below 1 are left out (a burn rate <= 1 never exhausts the budget, so they would
fire while the SLO is met): a 7-day window keeps the two pages and 3d/6h, and a
window under 50 hours, where no pair reaches 1 of its own, is refused,
as is a target whose burn rate, every event bad, stays under an alert's factor.
The policy model refuses both already (``controller.policy``), so a policy the
REST API took always has rules; these checks guard policies built without it.

Paging needs traffic: every burn-rate alert also requires
``AlertOptions.min_requests`` requests over its short window, so a handful of
slow requests at 3 a.m. does not wake anyone, while a slow trickle still
tickets over the 2h and 6h short windows.

The TTFT error ratio counts requests that got a first token and those the
engines ended without one (deadline, error): a hung engine ends neither,
counts nothing, and its ratio is 0/0.  The engines' own alerts
(:mod:`generators.alerts.engine_alerts`: stalled, unhealthy, restarting) page
and ticket on that.  The metric-absent tickets also watch the bucket at each
threshold, so an engine whose histogram lacks that edge is reported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.catalogue import (
    ERROR_RATIO_RECORD,
    FORECAST_RELIABLE,
    GOOD_EVENTS_RECORD,
    ITL_HISTOGRAM,
    LAYER_IMBALANCE_CV,
    LAYER_IMBALANCE_CV_NOISE,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    TOTAL_EVENTS_RECORD,
    UNSERVED_MATCHER,
    le_matcher,
    total,
    ttft_events,
)
from contracts.errors import ValidationError
from controller.policy import MIN_WINDOW_S, LatencyObjective, Policy, parse_duration_s
from controller.slo import (
    MIN_ALERT_BURN_RATE,
    BurnRateWindow,
    dropped_burn_rate_windows,
    error_budget,
    format_duration,
    standard_burn_rate_windows,
)
from controller.ttft_series import ttft_matchers, ttft_metric
from generators.alerts.engine_alerts import restart_alert, stall_alert, unhealthy_alert
from generators.alerts.model import AlertingRule, RecordingRule, Rule, RuleGroup, promql_string
from generators.alerts.options import AlertOptions
from generators.alerts.runbooks import with_runbook_urls
from generators.buckets import check_thresholds


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencySli:
    """A latency objective bound to the histogram that measures it."""

    slo: str
    """Short name used in labels and alert names: ``ttft`` or ``itl``."""
    title: str
    metric: str
    objective: LatencyObjective
    matchers: str = ""
    """Extra label matchers of the series (a TTFT allowance's labels on the normalized histogram)."""

    @property
    def le(self) -> str:
        """The ``le`` matcher of the bucket at the threshold."""
        return le_matcher(self.objective.threshold_s)


def latency_slis(policy: Policy) -> tuple[LatencySli, ...]:
    ttft = policy.objectives.ttft
    return (
        LatencySli(slo="ttft", title="TTFT", metric=ttft_metric(ttft.allowance), objective=ttft,
                   matchers=ttft_matchers(ttft.allowance)),
        LatencySli(slo="itl", title="ITL", metric=ITL_HISTOGRAM, objective=policy.objectives.itl),
    )


def burn_windows(policy: Policy) -> tuple[BurnRateWindow, ...]:
    """The workbook's window pairs, factors derived from the policy's compliance window.

    Pairs whose factor is below 1 are left out; a policy with none left is refused.
    """
    windows = standard_burn_rate_windows(policy.window_s)
    if not windows:
        left_out = dropped_burn_rate_windows(policy.window_s)
        dropped = ", ".join(f"{w.long_window}/{w.short_window} at {_num(w.burn_rate)}x" for w in left_out)
        raise ValidationError(
            [
                f"policy {policy.name!r}: compliance window {policy.window} is too short for burn-rate alerts: "
                f"every standard window pair would fire below {_num(MIN_ALERT_BURN_RATE)}x ({dropped}), while the "
                f"SLO is still met; use a window of at least {MIN_WINDOW_S // 3600}h"
            ]
        )
    problems = [
        f"policy {policy.name!r}: the {w.long_window}/{w.short_window} {w.severity} alert needs burn rate "
        f"{_num(w.burn_rate)}, but with target {sli.objective.target} the most it can reach is "
        f"{_num(1 / error_budget(sli.objective.target))} (every event bad); raise the target or shorten the window"
        for sli in latency_slis(policy)
        for w in windows
        if w.burn_rate * error_budget(sli.objective.target) > 1.0
    ]
    if problems:
        raise ValidationError(problems)
    return windows


def dropped_windows_note(policies: Sequence[Policy]) -> str:
    """Comment lines for the generated rules: which window pairs were left out of which policy, and why."""
    lines = [
        "# The slowest burn-rate pair tickets above 1x whatever the compliance window: a burn above 1",
        "# exhausts the error budget within it.  Faster pairs whose factor would be below 1 are left out:",
        "# a burn rate <= 1 never exhausts the budget, so they would fire while the SLO is met.",
    ]
    for policy in policies:
        dropped = dropped_burn_rate_windows(policy.window_s)
        if dropped:
            pairs = ", ".join(f"{w.long_window}/{w.short_window} ({_num(w.burn_rate)}x)" for w in dropped)
            lines.append(f"# Policy {policy.name} ({policy.window} window): left out {pairs}.")
    return "".join(f"{line}\n" for line in lines)


def rate_windows(windows: Sequence[BurnRateWindow]) -> tuple[str, ...]:
    """Every long and short window, shortest first (5m, 30m, 1h, 2h, 6h, 1d, 3d for 30 days)."""
    seconds = sorted({w.long_window_s for w in windows} | {w.short_window_s for w in windows})
    return tuple(format_duration(s) for s in seconds)


def build_rule_groups(policies: Sequence[Policy], options: AlertOptions | None = None) -> tuple[RuleGroup, ...]:
    """One rule group per policy: recording rules first, then its alerts."""
    options = options or AlertOptions()
    check_thresholds(policies, options.engine)
    problems: list[str] = []
    groups: list[RuleGroup] = []
    for policy in policies:
        try:
            windows = burn_windows(policy)
        except ValidationError as exc:
            problems.extend(exc.problems)
            continue
        rules: list[Rule] = []
        for sli in latency_slis(policy):
            rules.extend(_recording_rules(policy, sli, rate_windows(windows)))
        for sli in latency_slis(policy):
            rules.extend(_burn_rate_alerts(policy, sli, windows, options))
        rules.extend((stall_alert(policy, options), unhealthy_alert(policy, options), restart_alert(policy, options)))
        rules.append(_imbalance_alert(policy, options))
        if policy.forecast.enabled:
            rules.append(_forecast_alert(policy, options))
        rules.extend(_absent_alerts(policy, options))
        groups.append(
            RuleGroup(name=f"moeslo-slo-{policy.name}", interval=options.evaluation_interval, rules=tuple(rules))
        )
    if problems:
        raise ValidationError(problems)
    return tuple(groups) if options.runbook_url is None else with_runbook_urls(groups, options.runbook_url)


def _recording_rules(policy: Policy, sli: LatencySli, windows: Sequence[str]) -> list[RecordingRule]:
    labels = {"policy": policy.name, "slo": sli.slo}
    model = promql_string(policy.model_name)
    series = f'model_name="{model}"' + (f",{sli.matchers}" if sli.matchers else "")
    mine = _own_selector(policy, sli)
    rules: list[RecordingRule] = []
    for window in windows:
        good, total = GOOD_EVENTS_RECORD.format(window=window), TOTAL_EVENTS_RECORD.format(window=window)
        rules.append(
            RecordingRule(
                record=good,
                expr=f"sum by (model_name) (rate({sli.metric}_bucket{{{series},{sli.le}}}[{window}]))",
                labels=labels,
            )
        )
        events = total_events(sli.metric, sli.slo, series, f'model_name="{model}"', window)
        rules.append(RecordingRule(record=total, expr=events, labels=labels))
        rules.append(
            RecordingRule(
                record=ERROR_RATIO_RECORD.format(window=window),
                # No events gives 0/0 = NaN, and NaN > x is false: no traffic never alerts.
                expr=f"1 - ({good}{mine} / {total}{mine})",
                labels=labels,
            )
        )
    return rules


def total_events(metric: str, slo: str, series: str, models: str, window: str) -> str:
    """An SLI's events over ``window``, by model: its histogram's count (``series`` selects it), and for TTFT the
    requests the engines ended before a first token (deadline, error) of the ``models`` (a ``model_name``
    selector), which no TTFT histogram holds; ``or 0 * ...`` keeps the total where an engine (stock vLLM) exports
    no such counter.  The rules' total and the SLO overview's good-ratio denominator both."""
    count = f"sum by (model_name) (rate({metric}_count{{{series}}}[{window}]))"
    if slo != "ttft":
        return count
    unserved = f"{total(REQUESTS_WITHOUT_FIRST_TOKEN)}{{{models},{UNSERVED_MATCHER}}}"
    return ttft_events(count, f"sum by (model_name) (rate({unserved}[{window}]))")


def _burn_rate_alerts(
    policy: Policy, sli: LatencySli, windows: Sequence[BurnRateWindow], options: AlertOptions
) -> list[AlertingRule]:
    budget = error_budget(sli.objective.target)
    mine = _own_selector(policy, sli)
    # Requests, not events: ITL counts one event per token, so a single slow request is many events.
    requests = f'{{policy="{promql_string(policy.name)}",slo="ttft"}}'
    alerts: list[AlertingRule] = []
    for w in windows:
        factor = _num(w.burn_rate)
        expr = (
            f"({ERROR_RATIO_RECORD.format(window=w.long_window)}{mine} / {_num(budget)}) > {factor}\n"
            f"and\n"
            f"({ERROR_RATIO_RECORD.format(window=w.short_window)}{mine} / {_num(budget)}) > {factor}\n"
            f"and on (policy, model_name)\n"
            f"{TOTAL_EVENTS_RECORD.format(window=w.short_window)}{requests}"
            f" * {w.short_window_s} >= {options.min_requests}"
        )
        alerts.append(
            AlertingRule(
                alert=f"Moeslo{sli.title}ErrorBudgetBurn",
                expr=expr,
                for_=options.for_override or _burn_for(w, options),
                labels={
                    "severity": w.severity,
                    "policy": policy.name,
                    "slo": sli.slo,
                    "long_window": w.long_window,
                    "short_window": w.short_window,
                    "burn_rate_threshold": factor,
                },
                annotations={
                    "summary": (
                        f"{sli.title} SLO of policy {policy.name} burns its error budget at >= {factor}x "
                        f"({w.long_window}/{w.short_window})"
                    ),
                    "description": (
                        f"Over {w.long_window} the {sli.title} error budget of {{{{ $labels.model_name }}}} "
                        f"(threshold {sli.objective.threshold_s} s, target {sli.objective.target}) burned at "
                        f"{{{{ printf `%.3g` $value }}}}x; at {factor}x, {_num(100 * w.budget_fraction)}% of the "
                        f"{policy.window} budget is gone within {w.long_window}."
                    ),
                },
            )
        )
    return alerts


def _imbalance_alert(policy: Policy, options: AlertOptions) -> AlertingRule:
    max_cv = _num(policy.objectives.imbalance.max_cv)
    # The rebalancer acts after sustain_s of imbalance: give it that long twice before a ticket.
    sustain_s = policy.objectives.imbalance.sustain_s
    imbalance_for = format_duration(max(parse_duration_s(options.imbalance_for), 2 * sustain_s))
    selector = f'{{model_name="{promql_string(policy.model_name)}"}}'
    cv, noise = f"{LAYER_IMBALANCE_CV}{selector}", f"{LAYER_IMBALANCE_CV_NOISE}{selector}"
    # Judged as the rebalancer judges it: the CV with the window's sampling noise taken out
    # (sqrt(CV^2 - noise^2)), so a quiet engine's short windows do not open tickets; an engine
    # that exports no noise floor is judged on its CV as measured.
    return AlertingRule(
        alert="MoesloExpertImbalance",
        expr=f"max by (model_name) (sqrt(clamp_min(({cv} ^ 2 - {noise} ^ 2) or {cv} ^ 2, 0))) > {max_cv}",
        for_=options.for_override or imbalance_for,
        labels={"severity": "ticket", "policy": policy.name, "slo": "imbalance"},
        annotations={
            "summary": f"Expert load imbalance of policy {policy.name} above CV {max_cv}",
            "description": (
                "The most imbalanced MoE layer of {{ $labels.model_name }} has per-rank load CV "
                f"{{{{ printf `%.3g` $value }}}} (sampling noise taken out) > {max_cv} for {imbalance_for}; "
                "the rebalancer has not brought it back."
            ),
        },
    )


def _forecast_alert(policy: Policy, options: AlertOptions) -> AlertingRule:
    """A ticket when the controller has sized the fleet reactively (its forecast unreliable) for a while."""
    settings = policy.forecast
    return AlertingRule(
        alert="MoesloForecastUnreliable",
        expr=f'{FORECAST_RELIABLE}{{policy="{promql_string(policy.name)}"}} == 0',
        for_=options.for_override or options.forecast_for,
        labels={"severity": "ticket", "policy": policy.name, "slo": "forecast"},
        annotations={
            "summary": f"The traffic forecast of policy {policy.name} is unreliable: sizing is reactive",
            "description": (
                f"For {options.forecast_for} the controller has not trusted its forecast of policy {policy.name} "
                f"(warming up, or its rolling WAPE above {_num(settings.max_wape)} or interval coverage below "
                f"{_num(settings.min_coverage)}): it sizes from the load it sees, so peaks are met late. "
                "See moeslo_forecast_wape and moeslo_forecast_interval_coverage, and /v1/status."
            ),
        },
    )


def _absent_alerts(policy: Policy, options: AlertOptions) -> list[AlertingRule]:
    model = promql_string(policy.model_name)
    ttft, itl = latency_slis(policy)
    watched = (
        ("MoesloTTFTMetricAbsent", "ttft", f"{ttft.metric}_count", ttft.matchers, ttft),
        ("MoesloITLMetricAbsent", "itl", f"{itl.metric}_count", "", itl),
        ("MoesloExpertMetricsAbsent", "imbalance", LAYER_IMBALANCE_CV, "", None),
    )
    alerts = []
    for alert, slo, metric, extra, sli in watched:
        series = f'model_name="{model}"{"," + extra if extra else ""}'
        expr, edge = f"absent({metric}{{{series}}})", ""
        if sli is not None:
            # An engine whose histogram lacks the threshold's edge has _count but no good events.
            expr += f"\nor\nabsent({sli.metric}_bucket{{{series},{_le_regex(sli)}}})"
            edge = f", or none of its bucket at the {_num(sli.objective.threshold_s)} s threshold ({sli.le}),"
        alerts.append(
            AlertingRule(
                alert=alert,
                expr=expr,
                for_=options.for_override or options.absent_for,
                labels={"severity": "ticket", "policy": policy.name, "slo": slo},
                annotations={
                    "summary": f"No {metric} series for model {_template_text(policy.model_name)} "
                    f"(policy {policy.name})",
                    "description": (
                        f"Prometheus has had no {metric} series with "
                        f"model_name={_template_text(repr(policy.model_name))}{' and ' + extra if extra else ''}"
                        f"{edge} for {options.absent_for}: the engine is down, not scraped"
                        f"{', renamed, or writes other bucket edges' if sli else ', or renamed'}; the {slo} SLO cannot "
                        "be evaluated."
                    ),
                },
            )
        )
    return alerts


def _le_regex(sli: LatencySli) -> str:
    """The threshold bucket's ``le`` matcher as a regex: absent() then adds no ``le`` label, so a missing metric
    and a missing bucket give one alert, not two."""
    if sli.le.startswith('le=~"'):
        return sli.le
    return 'le=~"' + sli.le.removeprefix('le="').removesuffix('"').replace(".", "\\\\.") + '"'


def _burn_for(window: BurnRateWindow, options: AlertOptions) -> str:
    share_s = round(window.short_window_s * options.for_fraction_of_short_window)
    return format_duration(max(parse_duration_s(options.min_for), share_s))


def _own_selector(policy: Policy, sli: LatencySli) -> str:
    return f'{{policy="{promql_string(policy.name)}",slo="{sli.slo}"}}'


def _template_text(text: str) -> str:
    """``text`` as it reads in an annotation, which Prometheus renders as a Go template: a model name with
    ``{{`` or ``}}`` in it (the API allows them) made the whole rule file fail to load."""
    if "{{" not in text and "}}" not in text:
        return text
    return "{{ " + json.dumps(text) + " }}"  # a Go string literal prints it as it is


def _num(value: float) -> str:
    """A float without binary noise: 14.4, not 14.399999999999999."""
    return format(round(value, 9), ".9g")


__all__ = [
    "ERROR_RATIO_RECORD",
    "GOOD_EVENTS_RECORD",
    "TOTAL_EVENTS_RECORD",
    "AlertOptions",
    "LatencySli",
    "build_rule_groups",
    "burn_windows",
    "check_thresholds",
    "dropped_windows_note",
    "latency_slis",
    "rate_windows",
    "total_events",
]
