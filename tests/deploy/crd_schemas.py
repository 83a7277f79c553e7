"""JSON schemas for the custom resources deploy/ uses, converted from the real CRDs vendored in deploy/schemas/.

kubernetes-validate knows the built-in kinds only, so LeaderWorkerSet
(leaderworkerset.x-k8s.io/v1) and the Prometheus operator's PodMonitor,
ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1) are checked
against their CRDs' ``openAPIV3Schema``, converted to JSON Schema the way the
API server applies it under strict field validation (``kubectl apply``'s
default):

* an object schema with ``properties`` and no ``additionalProperties`` or
  ``x-kubernetes-preserve-unknown-fields`` takes no other fields (the server
  rejects unknown fields), so it gets ``additionalProperties: false``;
* ``x-kubernetes-int-or-string`` allows an integer or a string;
  ``nullable`` allows null;
* the root ``metadata`` (``type: object`` in every CRD) is the ObjectMeta
  subset manifests write, and ``apiVersion``/``kind`` must name the CRD's;
* descriptions and the other ``x-kubernetes-*`` list and map markers are
  dropped (they steer merging, not validity); CEL rules
  (``x-kubernetes-validations``) are not evaluated, and none of these CRDs has one;
* Go's ``^(?i)...`` patterns become Python's ``(?i)^...`` (same meaning).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "deploy" / "schemas"
CRD_FILES = {
    "LeaderWorkerSet": SCHEMA_DIR / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "PodMonitor": SCHEMA_DIR / "prometheus-operator" / "monitoring.coreos.com_podmonitors.yaml",
    "ServiceMonitor": SCHEMA_DIR / "prometheus-operator" / "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": SCHEMA_DIR / "prometheus-operator" / "monitoring.coreos.com_prometheusrules.yaml",
}
DROPPED = {"description", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
           "x-kubernetes-embedded-resource", "x-kubernetes-validations"}
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def to_json_schema(node: Any) -> Any:
    """One structural-schema node (and everything below it) as JSON Schema."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: to_json_schema(value) for key, value in node.items()
           if key not in DROPPED and not key.startswith("x-kubernetes-")}
    if "properties" in node:
        out["properties"] = {name: to_json_schema(child) for name, child in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if isinstance(node.get("pattern"), str):
        out["pattern"] = re.sub(r"^\^\(\?i\)", "(?i)^", node["pattern"])
    if node.get("nullable"):
        out.pop("nullable")
        if "type" in out:
            out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


@functools.cache
def crd(kind: str) -> dict[str, Any]:
    """The vendored CustomResourceDefinition of ``kind``."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document: dict[str, Any] = yaml.load(CRD_FILES[kind].read_text(encoding="utf-8"), Loader=loader)
    assert document["kind"] == "CustomResourceDefinition" and document["spec"]["names"]["kind"] == kind
    return document


def served_version(kind: str) -> dict[str, Any]:
    (version,) = [v for v in crd(kind)["spec"]["versions"] if v.get("served", True)]
    return version


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The JSON schema of one vendored CRD's served version (each has exactly one)."""
    version = served_version(kind)
    schema: dict[str, Any] = to_json_schema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{crd(kind)['spec']['group']}/{version['name']}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = OBJECT_META
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    schema["additionalProperties"] = False
    return schema


@functools.cache
def crd_validator(kind: str) -> Any:
    """A validator for ``kind`` (the schema is checked against the metaschema once, here)."""
    schema = crd_schema(kind)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def validate(resource: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` when ``resource`` does not fit its kind's CRD."""
    crd_validator(resource["kind"]).validate(resource)


CRD_KINDS = frozenset(CRD_FILES)
