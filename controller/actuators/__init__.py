"""Actuators behind small interfaces: replica counts (Kubernetes, local processes, dry-run) and expert placement.

The placement actuator (:mod:`controller.actuators.placement`) carries out live rebalancing on the
engines; it is imported where it is used, so this package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controller.actuators.base import Actuator, ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.actuators.dryrun import DryRunActuator
from controller.actuators.local import LocalActuator, LocalReplica
from controller.config import ControllerSettings

if TYPE_CHECKING:
    from controller.actuators.kubernetes import KubernetesActuator, api_client

__all__ = [
    "Actuator",
    "DryRunActuator",
    "KubernetesActuator",
    "LocalActuator",
    "LocalReplica",
    "ReplicaCount",
    "ScaleResult",
    "StillLeading",
    "always_leading",
    "api_client",
    "build_actuator",
]


def __getattr__(name: str) -> Any:
    # The kubernetes client takes over a second to import: only load it when it is used.
    if name in ("KubernetesActuator", "api_client"):
        from controller.actuators import kubernetes

        return getattr(kubernetes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_actuator(settings: ControllerSettings) -> Actuator:
    """The actuator the configuration names."""
    if settings.actuator == "kubernetes":
        from controller.actuators.kube_pods import PodLoadReader
        from controller.actuators.kubernetes import KubernetesActuator, api_client

        read_load = PodLoadReader() if settings.kubernetes.pod_deletion_cost else None
        return KubernetesActuator(api_client(settings.kubernetes), config=settings.kubernetes, read_load=read_load)
    if settings.actuator == "local":
        return LocalActuator(settings.local)
    return DryRunActuator()
