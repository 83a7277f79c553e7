"""``GET /v1/policies/{name}/endpoints``: the replicas a policy's target runs, for routers in front of them.

The entry router (``moeslo route --controller``) reads this list every
second or so, so replicas the controller adds or removes take or stop
taking requests without a restart.  The list is what the controller
scrapes: endpoints configured for the model, named by the policy's target,
and those its actuator started (the leader's own knowledge: a standby
lists only the first two).
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from controller.api.schemas import problem_responses
from controller.policy import LocalTarget, Policy
from controller.store import Store

router = APIRouter(prefix="/v1", tags=["policies"])


class EndpointView(Protocol):
    """The part of the controller service this route needs."""

    @property
    def is_leader(self) -> bool: ...

    def endpoints_for(self, policy: Policy) -> list[str]: ...


class PolicyEndpoints(BaseModel):
    """Base URLs (``http://host:port``) of the policy's serving replicas."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    endpoints: list[str]
    leader: bool
    """Whether the answering controller leads (a standby does not know the replicas the leader started)."""


@router.get("/policies/{name}/endpoints", response_model=PolicyEndpoints, responses=problem_responses(404, 422, 503))
def policy_endpoints(request: Request, name: str) -> PolicyEndpoints:
    """The replicas a router should send this policy's model's requests to."""
    store: Store = request.app.state.store
    policy = store.get_policy(name).policy
    view: EndpointView | None = getattr(request.app.state, "service", None)
    if view is None:
        endpoints = list(policy.target.endpoints) if isinstance(policy.target, LocalTarget) else []
        return PolicyEndpoints(policy=name, endpoints=endpoints, leader=False)
    return PolicyEndpoints(policy=name, endpoints=view.endpoints_for(policy), leader=view.is_leader)


__all__ = ["EndpointView", "PolicyEndpoints", "router"]
