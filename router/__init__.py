"""The entry router: sends each request to the replica where its estimated cost is served soonest.

Pure parts (the replay shares them): :mod:`router.types`,
:mod:`router.policies`, :mod:`router.prefix`, :mod:`router.features`,
:mod:`router.scrape`.  Adapters: :mod:`router.forward` (the proxy path),
:mod:`router.monitor` (scrapes and health checks), :mod:`router.app` (ASGI).
"""

from __future__ import annotations

from router.config import RouterConfig
from router.policies import (
    POLICY_NAMES,
    admission,
    estimated_cost,
    least_outstanding,
    policy_named,
    predict,
    prefix_affinity,
    round_robin,
)
from router.types import Choice, CostModel, Prediction, ReplicaState, RequestFeatures

__all__ = [
    "POLICY_NAMES",
    "Choice",
    "CostModel",
    "Prediction",
    "ReplicaState",
    "RequestFeatures",
    "RouterConfig",
    "admission",
    "estimated_cost",
    "least_outstanding",
    "policy_named",
    "predict",
    "prefix_affinity",
    "round_robin",
]
