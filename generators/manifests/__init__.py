"""Kubernetes manifests: the generated parts of deploy/ and a small kustomize for rendering overlays."""

from __future__ import annotations

from generators.manifests.generated import OVERLAY_ENGINES, deploy_files
from generators.manifests.kustomize import build, strategic_merge

__all__ = ["OVERLAY_ENGINES", "build", "deploy_files", "strategic_merge"]
