"""Alert generation: SLO policies -> Prometheus rules and an Alertmanager config.

``rules`` builds rule groups as data, ``alertmanager`` the routing, ``render``
formats both as YAML (or a PrometheusRule); nothing here does I/O.  Policies
come from :mod:`controller.policy_files`.
"""

from __future__ import annotations

from controller.alerting.alertmanager import ReceiverOptions, build_alertmanager_config
from controller.alerting.model import AlertingRule, RecordingRule, RuleGroup
from controller.alerting.render import (
    ALERTMANAGER_FILE,
    RULES_FILE,
    dump_yaml,
    dump_yaml_documents,
    prometheus_rule_manifest,
    render_alert_files,
    rules_document,
)
from controller.alerting.rules import AlertOptions, build_rule_groups, check_thresholds

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
