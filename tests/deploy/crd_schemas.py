"""Structural schemas for the custom resources deploy/ uses, which kubernetes-validate has no schema for.

They cover the fields we write (Prometheus operator monitoring.coreos.com/v1) and forbid unknown
ones at those levels, so a typo such as ``podMetricEndpoints`` fails like it would on a cluster.
"""

from __future__ import annotations

from typing import Any

_METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1},
        "matchExpressions": {"type": "array"},
    },
    "additionalProperties": False,
    "minProperties": 1,
}
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?)$",
}
_ENDPOINT: dict[str, Any] = {
    "type": "object",
    "required": ["port"],
    "properties": {"port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"}, "interval": _DURATION,
                   "scheme": {"enum": ["http", "https"]}},
    "additionalProperties": False,
}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


_RULE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "alert": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
        "expr": {"type": "string", "minLength": 1},
        "for": _DURATION,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "additionalProperties": False,
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": _resource("PodMonitor", {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {"selector": _LABEL_SELECTOR,
                       "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}},
        "additionalProperties": False,
    }),
    "ServiceMonitor": _resource("ServiceMonitor", {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {"selector": _LABEL_SELECTOR, "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}},
        "additionalProperties": False,
    }),
    "PrometheusRule": _resource("PrometheusRule", {
        "type": "object",
        "required": ["groups"],
        "properties": {"groups": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["name", "rules"],
            "properties": {"name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                           "rules": {"type": "array", "minItems": 1, "items": _RULE}},
            "additionalProperties": False,
        }}},
        "additionalProperties": False,
    }),
}
