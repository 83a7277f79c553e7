"""Plain data the engine loop takes and gives: its config, request outputs, the expert-load snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.errors import ValidationError
from engine.sampling import TokenLogprob
from engine.scheduler import SchedulerConfig
from engine.stats import IntArray


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    routing_window_steps: int = 256
    """Steps in the sliding window behind the imbalance figures."""
    idle_wait_s: float = 0.05
    """How long the idle loop sleeps between checks (it is woken early by new work)."""
    routing_interval_s: float = 0.1
    """How often the loop reads the routing counters (also when requests finish and when it goes idle)."""
    request_deadline_s: float | None = None
    """A request still unfinished this long after its arrival ends with finish reason ``deadline`` (None: off)."""
    enable_prefix_caching: bool = True
    """Share the KV blocks of equal prompt prefixes between requests (vLLM's automatic prefix caching; on by
    default as in vLLM V1).  The KV budget stays the same: cached blocks are evicted when it needs them."""
    warmup_requests: int = 8
    """Requests the engine-core process runs through the model before it says ready (0: none), so the
    first users' steps do not pay for first-call allocations and kernel selection.  Measured on the
    demo's replica (EP 2, one CPU), twelve 64-token prompts one after another, three interleaved
    rounds: median TTFT 24-32 ms and ITL 7.8-9.8 ms with it, 28-35 ms and 9.2-11.6 ms without (in
    the third round no difference); the first request's TTFT (64-87 ms) is the API process's first
    request either way."""
    core_silence_timeout_s: float = 150.0
    """How long the API process hears nothing from a running engine-core process before it judges it hung
    (stopped, or stuck in a step): ``/health`` 503, every request in flight failed, new ones refused.
    The core speaks at least once a second, idle or busy, but never in the middle of a step, so this is
    also the longest step it is allowed: above the 120 s an EP executor waits for a rank before it
    reports that rank itself (:mod:`engine.executors.multiproc`), and far above a large prefill chunk."""

    def __post_init__(self) -> None:
        if self.request_deadline_s is not None and not self.request_deadline_s > 0:
            raise ValidationError(f"request_deadline_s must be > 0, got {self.request_deadline_s}")
        if not self.core_silence_timeout_s > 0:
            raise ValidationError(f"core_silence_timeout_s must be > 0, got {self.core_silence_timeout_s}")
        if self.warmup_requests < 0:
            raise ValidationError(f"warmup_requests must be >= 0, got {self.warmup_requests}")


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One event of a request: a new token, the end, or both."""

    request_id: str
    token_id: int | None
    """The token generated now; None on an abort or error."""
    finished: bool = False
    finish_reason: str | None = None
    is_stop_token: bool = False
    """The token is the stop/eos token that ended the request (not shown as text)."""
    error: str | None = None
    prompt_tokens: int = 0
    generation_tokens: int = 0
    logprobs: TokenLogprob | None = None
    """The token's log-probability and the top alternatives, when the request asked for them."""
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    """With the first token of a request that asked: prompt tokens 1.. (the first has none), each as above."""


OutputCallback = Callable[[RequestOutput], None]
"""Called on the thread that delivers outputs; must be quick and must not block (hand off to a queue)."""


@dataclass(frozen=True, slots=True)
class ExpertLoad:
    """The routing window as plain data (``GET /v1/expert-load``)."""

    window_steps: int
    steps_in_window: int
    """Steps the counts cover: up to ``window_steps``, and past it by less than the oldest delta's steps (the
    window drops a delta whole, once the others cover ``window_steps``)."""
    expert_tokens: IntArray
    """(MoE layers, experts) routed tokens in the window."""
    rank_tokens: IntArray
    """(MoE layers, ranks) expert assignments processed per rank in the window."""
    imbalance_cv: list[float]
    balancedness: list[float]
    assignments: list[int]
    """Per layer: routed (token, expert) assignments in the window, the sample behind each CV."""
    expert_tokens_total: IntArray | None = None
    """(MoE layers, experts) routed tokens since the engine started, never reset: the difference of
    two readings is the load between them, windows that do not overlap (the rebalancer's history)."""


__all__ = ["EngineConfig", "ExpertLoad", "OutputCallback", "RequestOutput"]
