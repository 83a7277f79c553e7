"""Small factories over grafana-foundation-sdk builders, shared by every moeslo dashboard.

The SDK release pinned in pyproject (``grafana-foundation-sdk==1769699998!10.1.0``)
generates types for Grafana 10.1.x, so the JSON targets Grafana >= 10.1
(``schemaVersion`` 36); :data:`GRAFANA_VERSION` records it in each dashboard.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.heatmap import Panel as HeatmapPanel
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.table import Panel as TablePanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from contracts.catalogue import CURRENT_REPLICAS, DECISIONS, RUNNING, total
from controller.policy import Policy

GRAFANA_VERSION = "10.1"
"""Grafana release the SDK's types are generated for."""

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
MODEL = 'model_name=~"$model"'
POLICY = 'policy=~"$policy"'
RATE = "$__rate_interval"

_Value = TypeVar("_Value", bound=Hashable)


def selector_value(text: str) -> str:
    """A PromQL double-quoted string body for an exact (``=``) matcher; a model name may hold quotes or backslashes.

    Grafana substitutes its variables in every query before sending it (``$model``, ``${__range}``,
    ``[[policy]]``), inside string literals too: a model named ``ns$model`` read as ``ns.*`` and its panels
    showed no data.  ``$`` and ``[`` are written as the Go escapes ``\\x24`` and ``\\x5b``, which Grafana leaves
    alone and PromQL decodes back.  Not for a regex (``=~``) matcher, whose value is a regex, nor for text
    that is not PromQL (titles, legends).
    """
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\x24").replace("[", "\\x5b")


def query(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Dataquery:
    target = Dataquery().expr(expr).legend_format(legend or "__auto")
    if instant:
        target = target.instant()
    if table:
        target = target.format(PromQueryFormat.TABLE)
    return target


def target_line(slo: str, target: float) -> Dataquery:
    """A constant series at one objective's target (TTFT and ITL may have different targets)."""
    return query(f"vector({target:.6g})", f"{slo} target {target:.6g}")


def grouped(policies: Sequence[Policy], key: Callable[[Policy], _Value]) -> list[tuple[_Value, list[str]]]:
    """Each distinct ``key`` with the names of the policies that hold it, in the policies' order."""
    groups: dict[_Value, list[str]] = {}
    for policy in policies:
        groups.setdefault(key(policy), []).append(policy.name)
    return list(groups.items())


def target_lines(slo: str, policies: Sequence[Policy], target: Callable[[Policy], float]) -> list[Dataquery]:
    """One constant series per distinct target, named by its policies when the policies' targets differ."""
    groups = grouped(policies, target)
    return [
        query(f"vector({value:.6g})", f"{slo} target {value:.6g}"
              + (f" ({', '.join(names)})" if len(groups) > 1 else ""))
        for value, names in groups
    ]


def thresholds(*steps: tuple[float | None, str]) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=value, color=color) for value, color in steps]
    )


def timeseries(
    title: str,
    targets: Sequence[Dataquery],
    *,
    unit: str = "short",
    description: str = "",
    slo_line: float | None = None,
    min_value: float | None = None,
    stack: bool = False,
    width: int = 12,
) -> TimeseriesPanel:
    """A time series panel; ``slo_line`` draws the SLO threshold as a red dashed line."""
    panel = TimeseriesPanel().title(title).datasource(DATASOURCE).unit(unit).span(width).height(8)
    if description:
        panel = panel.description(description)
    for target in targets:
        panel = panel.with_target(target)
    if min_value is not None:
        panel = panel.min(min_value)
    if slo_line is not None:
        panel = panel.thresholds(thresholds((None, "transparent"), (slo_line, "red"))).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    if stack:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)
    return panel


def stat(title: str, target: Dataquery, *, unit: str, steps: Sequence[tuple[float | None, str]],
         description: str = "", width: int = 6) -> StatPanel:
    panel = (StatPanel().title(title).datasource(DATASOURCE).unit(unit).span(width).height(8)
             .with_target(target).thresholds(thresholds(*steps)))
    return panel.description(description) if description else panel


def heatmap(title: str, target: Dataquery, *, description: str = "", width: int = 12) -> HeatmapPanel:
    """Series as rows (pre-bucketed data, nothing recalculated)."""
    panel = HeatmapPanel().title(title).datasource(DATASOURCE).span(width).height(10).with_target(target)
    panel = panel.calculate(False)
    return panel.description(description) if description else panel


def matrix_table(title: str, target: Dataquery, *, row_field: str, column_field: str,
                 description: str = "", width: int = 12) -> TablePanel:
    """An instant query pivoted into a ``row_field`` x ``column_field`` matrix with coloured cells."""
    pivot = DataTransformerConfig(
        id_val="groupingToMatrix",
        options={"columnField": column_field, "rowField": row_field, "valueField": "Value"},
    )
    panel = (TablePanel().title(title).datasource(DATASOURCE).span(width).height(10).with_target(target)
             .with_transformation(pivot))
    return panel.description(description) if description else panel


def variables(dashboard: Dashboard, *, policy: bool) -> Dashboard:
    """``$datasource`` (any Prometheus), ``$model`` and, for controller panels, ``$policy``."""
    everything = VariableOption(selected=True, text="All", value="$__all")
    dashboard = dashboard.with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
    dashboard = dashboard.with_variable(
        QueryVariable("model").label("Model").datasource(DATASOURCE)
        .query(f"label_values({RUNNING}, model_name)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*")
        .current(everything)
    )
    if policy:
        dashboard = dashboard.with_variable(
            QueryVariable("policy").label("Deployment (SLO policy)").datasource(DATASOURCE)
            .query(f"label_values({CURRENT_REPLICAS}, policy)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*")
            .current(everything)
        )
    return dashboard


def counted_from_birth(series: str, window: str, function: str = "increase") -> str:
    """``function(series[window])``, with a series born within the window counted from 0.

    The controller creates a labelled counter at its first increment, so a series' first sample is already
    1, and ``increase`` and ``changes`` see nothing in a first sample: a decision (or rebalance) with a new
    reason would never show.  A series born since is one with no sample in the hour before the window (a
    range, so that one failed scrape's staleness marker does not make every series look new)."""
    # The born series first: ``or`` keeps its left side's series, and increase() of a first sample is 0, not none.
    born = f"({series} unless last_over_time({series}[1h] offset {window}))"
    return f"({born} or {function}({series}[{window}]))"


def decision_annotations() -> AnnotationQuery:
    """Controller decisions as annotations: one marker per change of ``moeslo_decisions_total``."""
    decisions = f"{total(DECISIONS)}{{{POLICY}}}"
    return (
        AnnotationQuery().name("Controller decisions").datasource(DATASOURCE).enable(True).icon_color("orange")
        .expr(f"sum by (policy, action, reason) {counted_from_birth(decisions, '1m', 'changes')} > 0")
    )


# The SDK's AnnotationQuery has no Prometheus-specific fields; these are added to the JSON.
_ANNOTATION_EXTRAS = {
    "Controller decisions": {
        "titleFormat": "{{action}} ({{policy}})",
        "textFormat": "{{reason}}",
        "tagKeys": "policy,action",
        "step": "30s",
    }
}


def ref_id(index: int) -> str:
    """A, ..., Z, AA, AB, ...: a panel with several policies has more than 26 targets (chr() would give '[')."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


def to_json_dict(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana JSON with stable panel ids, refIds and no null options."""
    document: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(dashboard.build()))
    next_id = 1
    for panel in document.get("panels", []):
        panel["id"] = next_id
        next_id += 1
        if panel.get("options") is None:
            panel.pop("options", None)
        for index, target in enumerate(panel.get("targets", [])):
            target["refId"] = ref_id(index)
    for variable in document.get("templating", {}).get("list", []):
        variable["id"] = variable["name"]
    for annotation in document.get("annotations", {}).get("list", []):
        annotation.update(_ANNOTATION_EXTRAS.get(annotation.get("name", ""), {}))
    document["id"] = None
    return document


def expressions(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, variable query and annotation of a dashboard."""
    found: list[tuple[str, str]] = []
    for panel in document.get("panels", []):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for annotation in document.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append((f"annotation {annotation['name']!r}", annotation["expr"]))
    return found


__all__ = [
    "DATASOURCE",
    "GRAFANA_VERSION",
    "MODEL",
    "POLICY",
    "RATE",
    "decision_annotations",
    "expressions",
    "grouped",
    "heatmap",
    "matrix_table",
    "query",
    "ref_id",
    "selector_value",
    "stat",
    "target_line",
    "target_lines",
    "thresholds",
    "timeseries",
    "to_json_dict",
    "variables",
]
