"""Actuators behind one small interface: Kubernetes, local processes, dry-run."""

from __future__ import annotations

from controller.actuators.base import Actuator, ReplicaCount, ScaleResult
from controller.actuators.dryrun import DryRunActuator
from controller.actuators.kubernetes import KubernetesActuator, api_client
from controller.actuators.local import LocalActuator, LocalReplica
from controller.config import ControllerSettings

__all__ = [
    "Actuator",
    "DryRunActuator",
    "KubernetesActuator",
    "LocalActuator",
    "LocalReplica",
    "ReplicaCount",
    "ScaleResult",
    "api_client",
    "build_actuator",
]


def build_actuator(settings: ControllerSettings) -> Actuator:
    """The actuator the configuration names."""
    if settings.actuator == "kubernetes":
        return KubernetesActuator(api_client(settings.kubernetes), config=settings.kubernetes)
    if settings.actuator == "local":
        return LocalActuator(settings.local)
    return DryRunActuator()
