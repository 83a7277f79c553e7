"""Prometheus rules and Alertmanager routes as plain data.

The generator builds these immutable values; :mod:`generators.alerts.render`
only formats them.  Field names follow the Prometheus rule-file format, so
``to_dict`` is a straight mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordingRule:
    """``record: <name>`` = ``expr``, with extra labels on the result."""

    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertingRule:
    """An alert that fires when ``expr`` returns series for ``for_`` (a Prometheus duration)."""

    alert: str
    expr: str
    for_: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
        }


Rule = RecordingRule | AlertingRule


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleGroup:
    """Rules Prometheus evaluates in order, every ``interval``.

    Recording rules come before the alerts that read them, so one evaluation
    sees the rates it just recorded.
    """

    name: str
    interval: str
    rules: tuple[Rule, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "interval": self.interval, "rules": [rule.to_dict() for rule in self.rules]}

    @property
    def alerts(self) -> tuple[AlertingRule, ...]:
        return tuple(rule for rule in self.rules if isinstance(rule, AlertingRule))


def promql_string(text: str) -> str:
    """``text`` as the body of a PromQL double-quoted string (a label matcher's value)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


__all__ = ["AlertingRule", "RecordingRule", "Rule", "RuleGroup", "promql_string"]
