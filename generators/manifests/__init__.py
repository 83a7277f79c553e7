"""Kubernetes manifests: the generated parts of deploy/ and a small kustomize for rendering overlays."""

from __future__ import annotations

from generators.manifests.generated import deploy_files, policy_engines
from generators.manifests.kustomize import build, strategic_merge
from generators.manifests.overlays import Overlay, load_overlays

__all__ = ["Overlay", "build", "deploy_files", "load_overlays", "policy_engines", "strategic_merge"]
