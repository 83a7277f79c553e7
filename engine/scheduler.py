"""Continuous batching over a paged KV cache.

Each step the scheduler fills a token budget (``max_num_batched_tokens``):
first the running sequences (one decode token each, or the next chunk of a
prompt still being prefilled), then waiting sequences in arrival order, whose
prompts are cut into chunks that fit what is left of the budget.  Prefill
chunks thus ride along with decode steps instead of stalling them.

With prefix caching on, a waiting sequence first looks up its leading full
blocks in the cache (:mod:`engine.kv_cache`): the blocks found join its table
and its prefill starts after them.  At least its last token is always
computed, so there are logits to sample from.  A request that asked for its
prompt's log-probabilities takes no cached blocks until they are all computed
(each prompt position's logits are needed); its own blocks are still cached
for others.  Blocks are keyed when they are allocated to the step that fills
them (vLLM's ``allocate_slots``), so a prompt admitted later in the same step
already shares them: the model writes the whole step's KV before any
attention reads it.  Only blocks full by the end of the step are keyed, never
one a later chunk completes; a step that fails drops the keys it gave
(:meth:`Scheduler.drop_unwritten`).

When the KV cache has no block for a running sequence, the most recently
admitted running sequence is preempted: its blocks are freed and it goes
back to the head of the waiting queue, to be recomputed from its prompt and
the tokens it already generated (vLLM's "recompute" preemption).

The waiting queue is bounded (``max_waiting``): a new request beyond it is
refused with :class:`OverloadedError`, never silently dropped.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts.errors import OverloadedError, ValidationError
from engine.batch import SeqChunk, StepPlan
from engine.errors import PromptTooLongError
from engine.kv_cache import BlockManager, blocks_for_tokens, extend_block_hashes
from engine.sampling import RequestSampler, SamplingParams, TokenLogprob
from engine.stats import RequestTiming

RETRY_RATE_WINDOW_S = 30.0
"""Finishes older than this say nothing of the rate the queue drains at now."""


def drain_time_s(finish_times_s: Iterable[float], waiting: int, now: float) -> float:
    """A 429's Retry-After: the waiting requests over the rate requests finished at in the last 30 s,
    1-60 s.

    The rate is taken over the span of those finishes, not up to ``now``: counted to ``now``, the idle
    minutes before a burst made the rate tiny and told every client of the burst to come back in a minute
    (the engine had served the burst in 4 s)."""
    recent = [t for t in finish_times_s if now - RETRY_RATE_WINDOW_S <= t <= now]
    if len(recent) < 2 or recent[-1] <= recent[0]:
        return 1.0
    rate = (len(recent) - 1) / (recent[-1] - recent[0])
    return float(min(60.0, max(1.0, waiting / rate)))


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Limits of the batch, read once at the edge."""

    max_num_seqs: int = 128
    """Sequences in the running batch at most."""
    max_num_batched_tokens: int = 512
    """Tokens computed per step at most (decode tokens and prefill chunks together)."""
    max_waiting: int = 256
    """Requests waiting for admission at most; more are refused (429)."""
    max_model_len: int | None = None
    """Prompt plus generated tokens of one sequence at most; None: the checkpoint's ``max_position_embeddings``
    (:func:`resolve_max_model_len`)."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be >= 1, got {getattr(self, name)}"
            for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting", "max_model_len")
            if getattr(self, name) is not None and getattr(self, name) < 1
        ]
        if problems:
            raise ValidationError(problems)


def resolve_max_model_len(asked: int | None, max_positions: int, kv_tokens: int) -> int:
    """The context to serve, as vLLM settles it: ``asked``, or the checkpoint's ``max_positions``.

    A context beyond the checkpoint's is refused (its rotary table ends there), and so is one asked for
    that the KV cache (``kv_tokens``) cannot hold: the operator chose it.  The checkpoint's own context is
    served even if the KV cache holds less; the scheduler then caps it (:attr:`Scheduler.context_note`).
    """
    if asked is None:
        return max_positions
    if asked > max_positions:
        raise ValidationError(
            f"max_model_len {asked} is longer than the checkpoint's context (max_position_embeddings "
            f"{max_positions} in its config.json); lower --max-model-len to {max_positions} or less")
    if asked > kv_tokens:
        raise ValidationError(
            f"the KV cache holds {kv_tokens} tokens < max_model_len {asked}: one sequence of the context would "
            f"not fit; raise --kv-cache-mb or lower --max-model-len to {kv_tokens} or less")
    return asked


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's tokens and progress through the engine."""

    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    timing: RequestTiming
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    """Tokens whose KV is in the cache (reset to 0 by a preemption)."""
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    counts_toward_queue_bound: bool = False
    """True while the request waits for its first admission (preempted ones do not count)."""
    block_hashes: list[bytes] = field(default_factory=list)
    """Prefix-cache keys of this sequence's full blocks so far (they depend on tokens only)."""
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """Prompt tokens 1.. so far: their log-probabilities, when the request asked (filled in position order)."""
    sampler: RequestSampler = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = RequestSampler(self.params)

    @property
    def wants_prompt_logits(self) -> bool:
        """Whether the prompt's log-probabilities were asked and are not all computed yet."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, start: int, stop: int) -> tuple[int, ...]:
        """Tokens ``start:stop`` of prompt + output."""
        prompt_len = len(self.prompt_token_ids)
        if stop <= prompt_len:
            return tuple(self.prompt_token_ids[start:stop])
        head = self.prompt_token_ids[start:] if start < prompt_len else []
        tail = self.output_token_ids[max(0, start - prompt_len) : stop - prompt_len]
        return (*head, *tail)


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    seq: Sequence
    num_tokens: int
    is_prompt: bool
    """True while the chunk computes prompt tokens (or recomputes after a preemption)."""


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    plan: StepPlan
    scheduled: tuple[ScheduledChunk, ...]
    """Same order as ``plan.chunks``."""
    num_preemptions: int
    prefix_cache_queries: int = 0
    """Tokens of the new requests admitted in this step that looked up the prefix cache (vLLM's count)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found in the cache (not computed)."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens computed in this step (recomputes included, cache hits not): the step's prefill work,
        not ``vllm:prompt_tokens`` (which counts each whole prompt once; the core does)."""
        return sum(c.num_tokens for c in self.scheduled if c.is_prompt)


class Scheduler:
    """Admission, batching and preemption; not thread-safe (the engine serialises calls)."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._num_new_waiting = 0
        """Waiting requests not yet admitted once (the queue bound applies to these)."""

    @property
    def max_model_len(self) -> int:
        """The longest sequence that can ever run: the context, or the whole KV cache if smaller."""
        asked = self.config.max_model_len
        return self.blocks.capacity_tokens if asked is None else min(asked, self.blocks.capacity_tokens)

    @property
    def context_note(self) -> str | None:
        """Why the context is shorter than configured (the KV cache holds fewer tokens); None when it is not."""
        asked, held = self.config.max_model_len, self.blocks.capacity_tokens
        if asked is None or asked <= held:
            return None
        return f"the server's KV cache holds only {held} tokens; the model's own context is {asked}"

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def check_admission(self, prompt_tokens: int, max_tokens: int, retry_after_s: float) -> None:
        """Raise if a new request could not be accepted now."""
        if prompt_tokens < 1:
            raise ValidationError("prompt must have at least one token")
        if prompt_tokens + max_tokens > self.max_model_len:
            raise PromptTooLongError(prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                     max_model_len=self.max_model_len, context_note=self.context_note)
        if self._num_new_waiting >= self.config.max_waiting:
            raise OverloadedError(
                f"waiting queue is full ({self.config.max_waiting} requests); retry later",
                retry_after_s=retry_after_s,
            )

    def can_admit(self) -> bool:
        """Whether the waiting queue has room for one more request."""
        return self._num_new_waiting < self.config.max_waiting

    def add(self, seq: Sequence, retry_after_s: float = 1.0) -> None:
        self.check_admission(len(seq.prompt_token_ids), seq.params.max_tokens, retry_after_s)
        seq.status = SeqStatus.WAITING
        seq.counts_toward_queue_bound = True
        self.waiting.append(seq)
        self._num_new_waiting += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of the queues and free its blocks (finished, aborted or failed)."""
        if seq.status is SeqStatus.FINISHED:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
            self._leave_queue_bound(seq)
        self.blocks.free(seq.seq_id)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []
        preemptions = queries = hits = 0

        # 1. Running sequences, oldest first; preempt the youngest when blocks run out.
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            want = min(seq.num_tokens - seq.num_computed, budget)
            while not self.blocks.ensure(seq.seq_id, seq.num_computed + want):
                victim = self.running[-1]
                self._preempt(victim)
                preemptions += 1
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break  # seq preempted itself: nothing younger is left to run
            # A last prompt chunk of one token is still prompt (no output yet); after a preemption it is the
            # pending output token, a decode.
            is_prompt = seq.num_computed < seq.num_tokens - 1 or not seq.output_token_ids
            self._cache_scheduled(seq, seq.num_computed + want)
            scheduled.append(ScheduledChunk(seq, want, is_prompt=is_prompt))
            budget -= want
            index += 1

        # 2. Waiting sequences in order (preempted ones sit at the head), while budget and blocks last.
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not preemptions:
            seq = self.waiting[0]
            cached = self._cached_prefix(seq)
            cached_tokens = len(cached) * self.blocks.block_size
            want = min(seq.num_tokens - cached_tokens, budget)
            extra = blocks_for_tokens(cached_tokens + want, self.blocks.block_size) - len(cached)
            if extra > self.blocks.num_free - self.blocks.num_evictable(cached):
                break
            if cached:
                self.blocks.take_cached(seq.seq_id, cached)
                seq.num_computed = cached_tokens
            allocated = self.blocks.ensure(seq.seq_id, cached_tokens + want)
            assert allocated, "the free count was checked above"
            self._cache_scheduled(seq, cached_tokens + want)
            if self.blocks.enable_prefix_caching and seq.num_preemptions == 0 and not seq.wants_prompt_logits:
                queries += seq.num_tokens
                hits += cached_tokens
            self.waiting.popleft()
            self._leave_queue_bound(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledChunk(seq, want, is_prompt=True))
            budget -= want

        return SchedulerOutput(self._plan(scheduled), tuple(scheduled), preemptions, queries, hits)

    def _plan(self, scheduled: list[ScheduledChunk]) -> StepPlan:
        return StepPlan(tuple(
            SeqChunk(
                seq_id=c.seq.seq_id,
                num_computed=c.seq.num_computed,
                token_ids=c.seq.token_at(c.seq.num_computed, c.seq.num_computed + c.num_tokens),
                block_table=self.blocks.block_table(c.seq.seq_id),
                needs_logits=c.seq.num_computed + c.num_tokens == c.seq.num_tokens,
                all_logits=c.seq.wants_prompt_logits,
            )
            for c in scheduled
        ))

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding ``seq``'s leading full blocks, its last token left out (it needs logits)."""
        if not self.blocks.enable_prefix_caching or seq.wants_prompt_logits:
            return []  # (vLLM's rule: the positions whose logits are wanted must be computed)
        size = self.blocks.block_size
        extend_block_hashes(seq.block_hashes, seq.token_at, seq.num_tokens, size)
        return self.blocks.cached_prefix(seq.block_hashes, (seq.num_tokens - 1) // size)

    def _cache_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        """Key ``seq``'s blocks that are full once its first ``num_tokens`` tokens are computed (this step's)."""
        size = self.blocks.block_size
        if not self.blocks.enable_prefix_caching or num_tokens // size <= self.blocks.num_keyed(seq.seq_id):
            return
        extend_block_hashes(seq.block_hashes, seq.token_at, num_tokens, size)
        self.blocks.cache_full_blocks(seq.seq_id, seq.block_hashes, num_tokens)

    def drop_unwritten(self, out: SchedulerOutput) -> None:
        """The step ``out`` planned failed: the blocks it was to fill lose the keys they got when allocated
        (their KV may never have been written).  Call before its sequences are finished or run again."""
        size = self.blocks.block_size
        for chunk in out.scheduled:
            self.blocks.drop_keys(chunk.seq.seq_id, chunk.seq.num_computed // size)

    def _leave_queue_bound(self, seq: Sequence) -> None:
        if seq.counts_toward_queue_bound:
            seq.counts_toward_queue_bound = False
            self._num_new_waiting -= 1

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)  # keyed blocks stay cached: its recompute (or another prompt) may find them
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)


__all__ = [
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SeqStatus",
    "Sequence",
    "drain_time_s",
]
