"""Reading an overlay's inputs from deploy/: its policies and its hand-written workloads (file I/O only).

The generated files of an overlay derive from these two: the policies give the
rules, and the workloads say which engine (and so which histogram buckets)
each policy's target runs.  Only the overlay's own resource files are read,
not ``generated/`` and not the base, so rendering works before anything is
generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import DataError
from controller.policy import Policy
from controller.policy_files import load_policies
from generators.manifests.kustomize import load_documents, read_kustomization

POLICIES_FILE = "policies.yaml"


@dataclass(frozen=True, kw_only=True, slots=True)
class Overlay:
    """What an overlay's generated files are made from."""

    policies: tuple[Policy, ...]
    workloads: tuple[dict[str, Any], ...] = ()
    """The overlay's own resources (Deployments, LeaderWorkerSets, ...), as written."""


def hand_written_resources(directory: Path) -> list[dict[str, Any]]:
    """The documents of the kustomization's resource files in ``directory`` (not directories, not generated/)."""
    documents: list[dict[str, Any]] = []
    for entry in read_kustomization(directory)["resources"]:
        target = directory / entry
        if not target.is_dir() and Path(entry).parts[0] != "generated":
            documents.extend(load_documents(target))
    return documents


def load_overlay(directory: Path) -> Overlay:
    return Overlay(policies=load_policies(directory / POLICIES_FILE),
                   workloads=tuple(hand_written_resources(directory)))


def load_overlays(deploy_dir: Path) -> dict[str, Overlay]:
    """Every overlay under ``deploy_dir/overlays`` that has a policies file, by name.

    ``deploy_dir`` must be a deploy tree (a ``base/`` inside): rendering into any other directory would
    scatter generated files where nothing reads them.
    """
    if not (deploy_dir / "base").is_dir():
        raise DataError("not a deploy directory: it has no base/ (the project's deploy/ has one)", path=str(deploy_dir))
    return {path.parent.name: load_overlay(path.parent)
            for path in sorted((deploy_dir / "overlays").glob(f"*/{POLICIES_FILE}"))}


__all__ = ["POLICIES_FILE", "Overlay", "hand_written_resources", "load_overlay", "load_overlays"]
