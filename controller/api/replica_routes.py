"""The replicas a policy's target runs, for what stands in front of them and what watches them.

``GET /v1/policies/{name}/endpoints``: the entry router (``moeslo route
--controller``) reads this list every second or so, so replicas the
controller adds or removes take or stop taking requests without a restart.
The list is what the controller scrapes: endpoints configured for the model,
named by the policy's target, and those its actuator started (the leader's
own knowledge: a standby lists only the first two).

``GET /v1/scrape-targets``: every policy's replicas in Prometheus's HTTP
service-discovery format (``http_sd_configs``), so Prometheus scrapes the
replicas a local actuator started on whatever ports it found free.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol
from urllib.parse import urlsplit

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
    return PolicyEndpoints(policy=name, endpoints=_endpoints(view, policy), leader=view is not None and view.is_leader)


def _endpoints(view: EndpointView | None, policy: Policy) -> list[str]:
    """The service's list; without a service (the API alone), the endpoints the policy's target names."""
    if view is not None:
        return view.endpoints_for(policy)
    return list(policy.target.endpoints) if isinstance(policy.target, LocalTarget) else []


class TargetGroup(BaseModel):
    """One group of Prometheus HTTP service discovery: ``host:port`` targets and the labels they share."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str]
    labels: dict[str, str]


@router.get("/scrape-targets", response_model=list[TargetGroup], responses=problem_responses(503),
            tags=["replicas"])  # fmt: skip
def scrape_targets(request: Request) -> list[TargetGroup]:
    """Every policy's replicas as Prometheus ``http_sd_configs`` target groups.

    A replica listed by several policies is one target (scraped twice, its counters would count
    twice in every sum); a base URL's scheme and path become ``__scheme__`` and ``__metrics_path__``.
    """
    store: Store = request.app.state.store
    view: EndpointView | None = getattr(request.app.state, "service", None)
    groups: dict[tuple[str, str], set[str]] = defaultdict(set)
    for stored in store.list_policies():
        for url in _endpoints(view, stored.policy):
            parts = urlsplit(url)
            groups[(parts.scheme, parts.path.rstrip("/") + "/metrics")].add(parts.netloc)
    return [TargetGroup(targets=sorted(hosts), labels={"__scheme__": scheme, "__metrics_path__": path})
            for (scheme, path), hosts in sorted(groups.items())]


__all__ = ["EndpointView", "PolicyEndpoints", "TargetGroup", "router"]
