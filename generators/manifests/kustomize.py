"""A small kustomize in Python, for machines without the kustomize binary (CI, tests).

Supports what deploy/ uses and refuses the rest: ``resources`` (files, and
directories holding a kustomization), ``components`` (directories holding a
``kind: Component`` kustomization, applied to everything accumulated so far),
``namespace``, ``labels`` (``pairs``, metadata only, as with
``includeSelectors: false``), ``patches`` given by ``path`` (strategic-merge
patches matched by kind and name) and ``images`` (``name`` with ``newName``,
``newTag`` or ``digest``, applied to every ``containers``/``initContainers``
list at any depth, as kustomize's image transformer does, so the pod templates
inside a LeaderWorkerSet are covered too).  Merging follows kustomize: maps
merge; for built-in kinds, lists of named items (containers, env, volumes, ...)
merge by ``name``; custom resources (no schema) take JSON-merge-patch
semantics, so their lists are replaced whole.  The tests compare its output
with ``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from contracts.errors import DataError
from contracts.text_files import read_text, yaml_error

SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "components", "patches", "images"}
IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}
CONTAINER_LISTS = ("containers", "initContainers")
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
    return _build(Path(directory), inside=())


def _build(root: Path, *, inside: tuple[Path, ...]) -> list[dict[str, Any]]:
    """``build``, where ``inside`` are the kustomizations that include this one (to refuse a cycle)."""
    kustomization = _load_kustomization(root, kind="Kustomization")
    if root.resolve() in inside:
        raise DataError("includes itself through its resources (a cycle)", path=str(root / "kustomization.yaml"))
    resources: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        target = root / entry
        if target.is_dir():
            resources.extend(_build(target, inside=(*inside, root.resolve())))
        else:
            resources.extend(load_documents(target))
    for entry in kustomization["components"]:
        component = root / entry
        spec = _load_kustomization(component, kind="Component")
        resources.extend(doc for item in spec["resources"] for doc in load_documents(component / item))
        _transform(resources, component, spec)
    _transform(resources, root, kustomization)
    return resources


def read_yaml(path: Path, what: str) -> list[Any]:
    """Every document of a YAML file; a DataError of one line names the file (and the line) otherwise."""
    text = read_text(path, what=what)
    try:
        return list(yaml.safe_load_all(text))
    except RecursionError as exc:
        raise DataError("invalid YAML: nested too deeply", path=str(path)) from exc
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path, text) from exc


def read_kustomization(root: Path) -> dict[str, Any]:
    """``root/kustomization.yaml`` as a mapping whose ``resources`` and ``components`` are lists of paths."""
    path = root / "kustomization.yaml"
    documents = [doc for doc in read_yaml(path, "kustomization") if doc is not None]
    if len(documents) > 1:
        raise DataError(f"a kustomization is one YAML document, found {len(documents)}", path=str(path))
    kustomization = documents[0] if documents else {}
    if not isinstance(kustomization, dict):
        raise DataError(f"a kustomization must be a mapping, got {_type_name(kustomization)}", path=str(path))
    _check_list(kustomization, "resources", str, path)
    _check_list(kustomization, "components", str, path)
    return kustomization


def _check_list(kustomization: dict[str, Any], key: str, item: type, path: Path) -> None:
    """``kustomization[key]`` must be a list of ``item``; absent or empty (``key:`` alone) it becomes []."""
    if kustomization.get(key) is None:
        kustomization[key] = []
    entries = kustomization[key]
    what = "path" if item is str else "mapping"
    if not isinstance(entries, list):
        raise DataError(f"{key} must be a list of {what}s, got {_type_name(entries)}", path=str(path))
    for index, entry in enumerate(entries):
        if not isinstance(entry, item) or entry == "":
            raise DataError(f"{key}[{index}] must be a {what}, got {_type_name(entry)}", path=str(path))


def _type_name(value: Any) -> str:
    if value == "":
        return "an empty string"
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "true or false", int: "a number",
             float: "a number", type(None): "nothing"}
    return names.get(type(value), type(value).__name__)


def _load_kustomization(root: Path, *, kind: str) -> dict[str, Any]:
    path = root / "kustomization.yaml"
    kustomization = read_kustomization(root)
    unsupported = sorted(set(kustomization) - SUPPORTED_FIELDS)
    if unsupported:
        raise DataError(f"unsupported kustomization fields: {', '.join(unsupported)}", path=str(path))
    if kustomization.get("kind", "Kustomization") != kind:
        raise DataError(f"expected kind {kind}, got {kustomization.get('kind')}", path=str(path))
    if kind == "Component" and kustomization["components"]:
        raise DataError("components inside a component are not supported", path=str(path))
    for key in ("patches", "labels", "images"):
        _check_list(kustomization, key, dict, path)
    if not isinstance(kustomization.get("namespace") or "", str):
        raise DataError(f"namespace must be a string, got {_type_name(kustomization['namespace'])}", path=str(path))
    return kustomization


def _transform(resources: list[dict[str, Any]], root: Path, kustomization: dict[str, Any]) -> None:
    """This kustomization's own transformers, in kustomize's order: patches, namespace, labels, images."""
    path = root / "kustomization.yaml"
    for patch_entry in kustomization["patches"]:
        if set(patch_entry) != {"path"} or not isinstance(patch_entry["path"], str):
            raise DataError(f"only `patches: - path: FILE` is supported, got {patch_entry}", path=str(path))
        for patch in load_documents(root / patch_entry["path"]):
            _apply_patch(resources, patch, str(root / patch_entry["path"]))
    namespace = kustomization.get("namespace")
    for label_set in kustomization["labels"]:
        if set(label_set) != {"pairs"} or not isinstance(label_set["pairs"], dict):
            raise DataError("only `labels: - pairs: {NAME: VALUE}` is supported", path=str(path))
    for resource in resources:
        metadata = resource.setdefault("metadata", {})
        if namespace and resource.get("kind") not in CLUSTER_SCOPED_KINDS:
            metadata["namespace"] = namespace
        for label_set in kustomization["labels"]:
            metadata.setdefault("labels", {}).update(label_set["pairs"])
    for image in kustomization["images"]:
        if "name" not in image or set(image) - IMAGE_FIELDS:
            raise DataError(f"images entries take {', '.join(sorted(IMAGE_FIELDS))} (name required), got {image}",
                            path=str(path))
        for resource in resources:
            _set_images(resource, image)


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """``registry/name:tag@digest`` -> (``registry/name``, tag or None, digest or None)."""
    name, _, digest = reference.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1:], digest or None
    return name, None, digest or None


def _set_images(node: Any, image: dict[str, str]) -> None:
    """Rewrite every container image named ``image["name"]`` below ``node``."""
    if isinstance(node, list):
        for item in node:
            _set_images(item, image)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in CONTAINER_LISTS and isinstance(value, list):
            for container in value:
                if isinstance(container, dict) and isinstance(container.get("image"), str):
                    container["image"] = _retag(container["image"], image)
        _set_images(value, image)


def _retag(reference: str, image: dict[str, str]) -> str:
    name, tag, digest = split_image(reference)
    if name != image["name"]:
        return reference
    name = image.get("newName", name)
    if "digest" in image:
        return f"{name}@{image['digest']}"
    if "newTag" in image:
        return f"{name}:{image['newTag']}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty documents of a resource (or patch) file, each a mapping."""
    documents = [doc for doc in read_yaml(path, "resource") if doc]
    for number, document in enumerate(documents, start=1):
        if not isinstance(document, dict):
            raise DataError(f"document {number} must be a mapping (a Kubernetes object), got {_type_name(document)}",
                            path=str(path))
    return documents


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


__all__ = ["build", "load_documents", "read_kustomization", "read_yaml", "split_image", "strategic_merge"]
