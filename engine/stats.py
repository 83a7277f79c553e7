"""Plain-data statistics the engine records (no exporter imports here).

Every field names its unit and clock.  Intervals come from
``time.monotonic()``; nothing here is a wall-clock timestamp.  Exporters
subscribe through :class:`StatsSink` and only translate.

The imbalance of the routing window is :mod:`contracts.imbalance`'s math
(the controller and the vLLM plugin use the same functions).  This module
depends on numpy only.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from contracts.imbalance import balancedness, imbalance_cv

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class RequestTiming:
    """Life of one request on the engine's monotonic clock (seconds)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    scheduled_s: float | None = None
    """First time the scheduler gave the request compute."""
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    """Time each output token was produced, the first included."""
    finished_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def itls_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def prefill_s(self) -> float | None:
        if self.scheduled_s is None or self.first_token_s is None:
            return None
        return self.first_token_s - self.scheduled_s

    @property
    def decode_s(self) -> float | None:
        if self.first_token_s is None or self.finished_s is None:
            return None
        return self.finished_s - self.first_token_s


TEXT_COMPLETION = "text_completion"
CHAT = "chat"
"""The GenAI operation names (``gen_ai.operation.name``) of the OpenAI completions and chat completions."""


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """One finished (or aborted) request, in seconds and tokens."""

    request_id: str
    finish_reason: str
    """``length``, ``stop``, ``abort`` or ``error``."""
    prompt_tokens: int
    generation_tokens: int
    e2e_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float | None
    mean_itl_s: float | None
    operation: str = TEXT_COMPLETION
    """The GenAI operation it served (the API process knows it; the core reports the default)."""
    response_id: str | None = None
    """The id of the OpenAI response it is a choice of, as the client received it (``chatcmpl-...``); None: a
    request of its own (not served through the OpenAI API)."""


@dataclass(frozen=True, slots=True)
class EndedChoice:
    """One choice of an OpenAI request, as it ended."""

    index: int
    """Choice ``index`` of the response: sample ``index % n`` of prompt ``index // n``."""
    end_s: float
    """Monotonic time it ended."""
    stats: FinishedRequestStats
    reported: bool = True
    """False: failed in the API process (the engine core died), never reported by the core."""


@dataclass(frozen=True, slots=True)
class ApiRequestStats:
    """One OpenAI request once every choice it sent to the core has ended (a choice the core refused is not in
    it): what is observed once per request, not per choice."""

    response_id: str
    operation: str
    n: int
    """Choices per prompt."""
    choices: tuple[EndedChoice, ...]
    """In choice order."""

    def per_prompt(self) -> list[tuple[EndedChoice, ...]]:
        """The choices of each prompt (vLLM's parent request: one prompt's ``n`` samples), in prompt order."""
        prompts: dict[int, list[EndedChoice]] = {}
        for choice in self.choices:
            prompts.setdefault(choice.index // self.n, []).append(choice)
        return [tuple(prompts[i]) for i in sorted(prompts)]


@dataclass(frozen=True, slots=True)
class PlacementSwapStats:
    """One applied placement change."""

    duration_s: float
    """Wall time of the swap on the monotonic clock, all ranks included."""
    experts_moved: int
    """Expert weights that changed rank (one count per (layer, expert, destination rank))."""
    bytes_moved: int


@dataclass(frozen=True, slots=True)
class RoutingDelta:
    """Routed-token counts of one or more engine steps (all layers)."""

    expert_tokens: IntArray
    """(layers, logical experts): tokens routed to each expert in these steps (top-k assignments)."""
    rank_tokens: IntArray
    """(layers, ranks): expert assignments each rank processed in these steps."""
    steps: int = 1
    """Engine steps these counts cover (the engine reads its counters at its own rate, not every step)."""


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one engine step did, recorded when it ends."""

    now_s: float
    """Monotonic time at the end of the step."""
    step_duration_s: float
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    """Fraction of KV blocks in use, 0..1."""
    prompt_tokens: int
    """Prompt tokens of the requests whose first token came out in this step: each whole prompt, cached tokens
    included, counted once (a recompute after a preemption is not counted again), as vLLM's
    ``vllm:prompt_tokens``."""
    generation_tokens: int
    ttfts_s: tuple[float, ...] = ()
    """TTFT of each request whose first token came out in this step."""
    itls_s: tuple[float, ...] = ()
    """Inter-token latency of each other token that came out in this step."""
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    """Prompt tokens of the requests first admitted in this step, when prefix caching is on
    (``vllm:prefix_cache_queries``; recomputes after a preemption are not counted, as in vLLM)."""
    prefix_cache_hits: int = 0
    """Of those, tokens whose KV came from the prefix cache (``vllm:prefix_cache_hits``)."""
    finished: tuple[FinishedRequestStats, ...] = ()
    routing: RoutingDelta | None = None
    """Routing counts since the last ones, read at the engine's rate (most steps carry none).
    With a ``placement_swap`` in the same stats, these were routed before it."""
    placement_swap: PlacementSwapStats | None = None


class StatsSink(Protocol):
    """Anything that consumes engine statistics (exporters implement this)."""

    def record(self, step: StepStats) -> None: ...


class RoutingWindow:
    """Sliding window over the last ``window_steps`` steps of routing counts.

    Deltas may cover several steps each (``RoutingDelta.steps``); the oldest
    leaves once the others still cover ``window_steps``.  Keeps running sums
    so that reading the window costs one subtraction per delta, not a sum
    over the window.
    """

    def __init__(self, num_layers: int, num_experts: int, num_ranks: int, window_steps: int = 256) -> None:
        if window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps}")
        self.window_steps = window_steps
        self._deltas: deque[RoutingDelta] = deque()
        self._steps = 0
        self._expert_sum: IntArray = np.zeros((num_layers, num_experts), dtype=np.int64)
        self._rank_sum: IntArray = np.zeros((num_layers, num_ranks), dtype=np.int64)

    def add(self, delta: RoutingDelta) -> None:
        if delta.rank_tokens.shape != self._rank_sum.shape:
            # The number of ranks changed: start the window afresh.
            self._deltas.clear()
            self._expert_sum = np.zeros_like(delta.expert_tokens)
            self._rank_sum = np.zeros_like(delta.rank_tokens)
            self._steps = 0
        self._deltas.append(delta)
        self._steps += delta.steps
        self._expert_sum += delta.expert_tokens
        self._rank_sum += delta.rank_tokens
        while len(self._deltas) > 1 and self._steps - self._deltas[0].steps >= self.window_steps:
            old = self._deltas.popleft()
            self._steps -= old.steps
            self._expert_sum -= old.expert_tokens
            self._rank_sum -= old.rank_tokens

    @property
    def steps(self) -> int:
        """Engine steps the window covers now."""
        return self._steps

    def reset(self) -> None:
        """Forget the window (after a placement change the old loads no longer apply)."""
        self._deltas.clear()
        self._steps = 0
        self._expert_sum[:] = 0
        self._rank_sum[:] = 0

    @property
    def expert_tokens(self) -> IntArray:
        """(layers, experts) routed tokens within the window."""
        return self._expert_sum.copy()

    @property
    def rank_tokens(self) -> IntArray:
        """(layers, ranks) processed assignments within the window."""
        return self._rank_sum.copy()

    def imbalance(self) -> FloatArray:
        """Per-layer CV of per-rank load within the window."""
        return imbalance_cv(self._rank_sum)

    def balancedness(self) -> FloatArray:
        """Per-layer mean/max of per-rank load within the window."""
        return balancedness(self._rank_sum)
