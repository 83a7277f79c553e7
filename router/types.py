"""The values at the router's boundary: what a request looks like, what a replica's load is, what was chosen.

Units sit in field names (``_s``, ``_tokens``); times are passed in, so the
replay's clock works as well as the proxy's.  Everything here is frozen:
policies read these and return a :class:`Choice`, they never mutate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contracts.ttft_objective import FLAT, TtftAllowance


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFeatures:
    """What the router knows of one request before sending it."""

    prompt_tokens: int
    """Prompt length: exact for token-id prompts, estimated (characters / 4) for text; a list of prompts, the sum."""
    prompts: int = 1
    """Prompts in the request (a completion's ``prompt`` may be a list of them)."""
    choices: int = 1
    """Choices asked per prompt (``n``): the engine runs each as a request of its own."""
    max_tokens: int = 16
    """Output tokens asked for (the request's ``max_tokens``)."""
    stream: bool = False
    prefix_blocks: tuple[int, ...] = ()
    """Hashes of the leading prompt blocks, each covering its block and all before it (chained)."""
    block_tokens: int = 16
    """Prompt tokens per prefix block."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaState:
    """One replica's load as the router sees it: the last scrape, corrected by the router's own counts."""

    name: str
    healthy: bool = True
    waiting: int = 0
    """Requests waiting to be scheduled (``vllm:num_requests_waiting``, at least the router's own unstarted)."""
    running: int = 0
    """Requests in the running batch (``vllm:num_requests_running``, at least the router's own started)."""
    kv_usage: float = 0.0
    """Fraction of KV cache blocks in use, 0..1."""
    pending_prefill_tokens: int = 0
    """Prompt tokens queued ahead of a new request (the router's own exactly, the rest estimated)."""
    outstanding: int = 0
    """Requests the router has sent to this replica and not seen finish."""
    prefill_tokens_per_s: float = 4000.0
    """How fast this replica computes prompt tokens (configured, or learned from observed TTFT)."""
    cached_prompt_tokens: int = 0
    """Of the request being routed, the leading prompt tokens this replica likely holds in its prefix
    cache (the router's record of the prompts it sent there: :mod:`router.prefix_index`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """The constants of the estimated-cost policy (defaults: the mission's objectives)."""

    ttft_objective_s: float = 0.5
    """At the reference prompt length; a longer prompt's objective adds ``ttft_allowance``'s allowance."""
    ttft_allowance: TtftAllowance = FLAT
    """The policy's per-length allowance (default: none, the flat objective), as the controller judges requests."""
    itl_objective_s: float = 0.02
    decode_step_s: float = 0.01
    """ITL of a replica with an empty batch."""
    max_batch: int = 128
    """Running batch at which a step's decode work has grown to a full extra step."""
    itl_per_seq_s: float | None = None
    """ITL added by each running sequence (a replica profile's ``itl_per_seq_s``; None:
    ``decode_step_s / max_batch``, a step that doubles at ``max_batch``)."""
    cached_token_cost: float = 0.0
    """Prefill time a cached prompt token still costs, relative to an uncached one (a replica profile's
    ``cached_token_cost``, as ``moeslo profile`` measures it; 0: a cache hit is free)."""
    kv_soft_limit: float = 0.8
    """KV usage above which a replica slows new prefills (block waits, preemption risk)."""
    kv_full_penalty: float = 4.0
    """Extra multiple of the predicted TTFT at 100 % KV usage (linear from the soft limit)."""

    def ttft_objective_for(self, prompt_tokens: int) -> float:
        """The TTFT a request of ``prompt_tokens`` may take and still be good (threshold plus its allowance)."""
        return self.ttft_objective_s + self.ttft_allowance.allowance_s(prompt_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the cost model expects of one replica for one request."""

    ttft_s: float
    itl_s: float
    itl_risk: bool
    """The predicted ITL exceeds the objective (the running batch is too large)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """A policy's answer: which replica (None: none can take it), why, and what it predicted."""

    replica: str | None
    reason: str
    """A fixed word per branch (``lowest_predicted_ttft``, ``prefix_owner``, ``all_over_budget``, ...)."""
    predicted_ttft_s: float | None = None
    retry_after_s: float | None = None
    """When ``replica`` is None: how long until the best replica is predicted back within the objective."""
    detail: Mapping[str, float] = field(default_factory=dict)
    """Per-replica figures behind the choice (predicted TTFT, load), for logs and tests."""


__all__ = ["Choice", "CostModel", "Prediction", "ReplicaState", "RequestFeatures"]
