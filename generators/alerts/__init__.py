"""Alert generation: SLO policies -> Prometheus rules and an Alertmanager config.

``rules`` builds rule groups as data, ``alertmanager`` the routing, ``render``
formats both as YAML (or a PrometheusRule); nothing here does I/O.  Policies
come from :mod:`controller.policy_files`.
"""

from __future__ import annotations

from generators.alerts.alertmanager import ReceiverOptions, build_alertmanager_config
from generators.alerts.model import AlertingRule, RecordingRule, RuleGroup
from generators.alerts.render import (
    ALERTMANAGER_FILE,
    RULES_FILE,
    dump_yaml,
    dump_yaml_documents,
    prometheus_rule_manifest,
    render_alert_files,
    rules_document,
)
from generators.alerts.rules import AlertOptions, build_rule_groups, check_thresholds

__all__ = [
    "ALERTMANAGER_FILE",
    "RULES_FILE",
    "AlertOptions",
    "AlertingRule",
    "ReceiverOptions",
    "RecordingRule",
    "RuleGroup",
    "build_alertmanager_config",
    "build_rule_groups",
    "check_thresholds",
    "dump_yaml",
    "dump_yaml_documents",
    "prometheus_rule_manifest",
    "render_alert_files",
    "rules_document",
]
