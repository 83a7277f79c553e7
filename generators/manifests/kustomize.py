"""A small kustomize in Python, for machines without the kustomize binary (CI, tests).

Supports what deploy/ uses and refuses the rest: ``resources`` (files, and
directories holding a kustomization), ``namespace``, ``labels`` (``pairs``,
metadata only, as with ``includeSelectors: false``) and ``patches`` given by
``path`` (strategic-merge patches matched by kind and name).  Merging follows
kustomize: maps merge; for built-in kinds, lists of named items (containers,
env, volumes, ...) merge by ``name``; custom resources (no schema) take
JSON-merge-patch semantics, so their lists are replaced whole.  The tests
compare its output with ``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from contracts.errors import DataError

SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "patches"}
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
}
BUILTIN_GROUPS = {
    "v1",
    "apps/v1",
    "batch/v1",
    "autoscaling/v2",
    "autoscaling/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "networking.k8s.io/v1",
    "coordination.k8s.io/v1",
}


def build(directory: str | Path) -> list[dict[str, Any]]:
    """The resources ``kustomize build directory`` would emit (in resource order)."""
    root = Path(directory)
    path = root / "kustomization.yaml"
    try:
        kustomization = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise DataError(f"cannot read kustomization: {exc.strerror}", path=str(path)) from exc
    unsupported = sorted(set(kustomization) - SUPPORTED_FIELDS)
    if unsupported:
        raise DataError(f"unsupported kustomization fields: {', '.join(unsupported)}", path=str(path))

    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = root / entry
        if target.is_dir():
            resources.extend(build(target))
        else:
            resources.extend(_load_documents(target))
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise DataError(f"only `patches: - path:` is supported, got {patch_entry}", path=str(path))
        for patch in _load_documents(root / patch_entry["path"]):
            _apply_patch(resources, patch, str(root / patch_entry["path"]))
    namespace = kustomization.get("namespace")
    for resource in resources:
        metadata = resource.setdefault("metadata", {})
        if namespace and resource.get("kind") not in CLUSTER_SCOPED_KINDS:
            metadata["namespace"] = namespace
        for label_set in kustomization.get("labels", []):
            if set(label_set) - {"pairs"}:
                raise DataError("only `labels: - pairs:` is supported", path=str(path))
            metadata.setdefault("labels", {}).update(label_set["pairs"])
    return resources


def _load_documents(path: Path) -> list[dict[str, Any]]:
    try:
        return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    except OSError as exc:
        raise DataError(f"cannot read resource: {exc.strerror}", path=str(path)) from exc
    except yaml.YAMLError as exc:
        raise DataError(f"invalid YAML: {exc}", path=str(path)) from exc


def _apply_patch(resources: list[dict[str, Any]], patch: dict[str, Any], where: str) -> None:
    kind, name = patch.get("kind"), patch.get("metadata", {}).get("name")
    matches = [r for r in resources if r.get("kind") == kind and r.get("metadata", {}).get("name") == name]
    if len(matches) != 1:
        raise DataError(f"patch for {kind}/{name} matches {len(matches)} resources, expected 1", path=where)
    target = matches[0]
    builtin = target.get("apiVersion") in BUILTIN_GROUPS
    merged = strategic_merge(target, patch, builtin=builtin)
    target.clear()
    target.update(merged)


def strategic_merge(base: Any, patch: Any, *, builtin: bool) -> Any:
    """``patch`` merged into ``base``: maps recursively, named lists by name (built-ins only)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, builtin=builtin)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if builtin and _named_list(base) and _named_list(patch):
        out_list = copy.deepcopy(base)
        index = {item["name"]: position for position, item in enumerate(out_list)}
        for item in patch:
            if item["name"] in index:
                out_list[index[item["name"]]] = strategic_merge(out_list[index[item["name"]]], item, builtin=True)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, dict) and "name" in i for i in value)


__all__ = ["build", "strategic_merge"]
