"""The router's configuration: one typed object, read once at the edge (``moeslo route``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from contracts.errors import ValidationError
from contracts.urls import base_url_problem, http_url_problem
from router.policies import POLICY_NAMES
from router.types import CostModel


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    replicas: tuple[str, ...] = ()
    """Base URLs of the replicas (``http://host:port``, no path), each also the replica's name and metric label."""
    controller_url: str | None = None
    """Read the replica set from this controller instead (``/v1/policies/{policy}/endpoints``)."""
    controller_policy: str | None = None
    """The controller's policy whose replicas to route to (None: its only policy)."""
    membership_interval_s: float = 1.0
    """How often the replica set is read from the controller."""
    policy: str = "cost"
    cost: CostModel = field(default_factory=CostModel)
    prefill_tokens_per_s: float = 4000.0
    """Prompt tokens per second each replica computes (the cost model's rate)."""
    mean_prompt_tokens: float = 256.0
    """Assumed prompt length of queued requests the router did not send itself."""
    admission: Literal["reject", "queue"] = "reject"
    """Every replica over the TTFT objective: 429 + Retry-After, or hold the request until one fits."""
    max_queue_s: float = 30.0
    """``queue``: how long a request is held before it gets the 429 after all."""
    max_queued: int = 1024
    """``queue``: the most requests held at once; one more gets the 429 at once (each holds its body and socket)."""
    scrape_interval_s: float = 0.5
    """How often each live replica's /metrics (and each ejected replica's /health) is read."""
    scrape_timeout_s: float = 1.0
    eject_after_silent: int = 10
    """Consecutive /metrics scrapes that time out before a replica is ejected: a frozen process still
    accepts connections but never answers (its requests would wait ``upstream_timeout_s``), while a
    busy one answers late now and then."""
    eject_after_5xx: int = 5
    """Consecutive server errors (5xx, relayed or the router's own 502 for a garbled answer) before a replica is
    ejected: one that fails every request at once looks the least loaded and would draw most of the traffic
    (Envoy's ``consecutive_5xx``). Any answer below 500 starts the count again."""
    readmit_after: int = 2
    """Consecutive passed health checks before an ejected replica takes requests again."""
    connect_timeout_s: float = 1.0
    upstream_timeout_s: float = 600.0
    """Longest wait for an upstream's next byte (a non-streaming completion's whole answer)."""
    affinity_blocks: int = 4
    load_factor: float = 1.25
    block_tokens: int = 16
    """Prompt tokens per prefix block (vLLM's default KV block size)."""
    prefix_max_blocks: int = 64
    """Leading blocks hashed per request: prefix affinity keys on the first ``affinity_blocks``, the cost
    policy discounts the cached ones (64 blocks of 16: the first 1,024 tokens)."""
    prefix_cache_tokens: int = 262_144
    """Prompt tokens each replica's prefix cache is assumed to hold (the router's LRU record of what it sent)."""
    max_connections: int = 0
    """Upstream connections open at once (0: no cap). The replicas' own queues and the router's admission bound
    the load; a cap here made requests past it wait for a connection, and that wait timed out as a replica's."""

    def __post_init__(self) -> None:
        problems = []
        if self.max_connections < 0:
            problems.append(f"max_connections: must be 0 (no cap) or more, got {self.max_connections}")
        if not self.replicas and self.controller_url is None:
            problems.append("replicas: at least one URL is needed (or a controller to read them from)")
        if self.replicas and self.controller_url is not None:
            problems.append("replicas: give replica URLs or a controller, not both")
        # The router adds /v1/completions, /metrics and /health to a replica's URL: it must end at the port.
        problems.extend(p for url in self.replicas if (p := base_url_problem("replicas", url)) is not None)
        if self.controller_url is not None and (p := http_url_problem("controller_url", self.controller_url)):
            problems.append(p)
        if len(set(self.replicas)) != len(self.replicas):
            problems.append("replicas: a URL is listed twice")
        if self.policy not in POLICY_NAMES:
            problems.append(f"policy: {self.policy!r} is not one of {', '.join(POLICY_NAMES)}")
        if self.admission not in ("reject", "queue"):
            problems.append(f"admission: {self.admission!r} is not reject or queue")
        for name in ("prefill_tokens_per_s", "scrape_interval_s", "scrape_timeout_s", "connect_timeout_s",
                     "upstream_timeout_s", "load_factor", "mean_prompt_tokens", "membership_interval_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                problems.append(f"{name}: must be > 0")
        if not self.max_queue_s >= 0:
            problems.append("max_queue_s: must be >= 0")
        cost = self.cost
        for name in ("ttft_objective_s", "itl_objective_s", "decode_step_s", "max_batch"):
            if not getattr(cost, name) > 0:
                problems.append(f"cost.{name}: must be > 0")
        if cost.itl_per_seq_s is not None and not cost.itl_per_seq_s >= 0:
            problems.append("cost.itl_per_seq_s: must be >= 0")
        for name in ("readmit_after", "eject_after_silent", "eject_after_5xx", "affinity_blocks", "block_tokens",
                     "prefix_max_blocks", "prefix_cache_tokens", "max_queued"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1")
        if problems:
            raise ValidationError(problems)


__all__ = ["RouterConfig"]
