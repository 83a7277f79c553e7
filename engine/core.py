"""The engine core: scheduler -> executor -> sampler, one step at a time, on one thread.

:class:`EngineCore` has no threads, locks or sockets.  Whoever drives it (the
engine-core process's loop in :mod:`engine.core_proc`, or the in-process
:class:`~engine.llm_engine.LLMEngine` of the unit tests) calls
:meth:`EngineCore.add_request` and :meth:`EngineCore.abort` between steps and
:meth:`EngineCore.step` to run one; each step returns the outputs it produced
and its :class:`~engine.stats.StepStats`.

Every accepted request ends with exactly one final :class:`RequestOutput`
whose ``finish_reason`` is ``length``, ``stop``, ``abort``, ``error`` or
``deadline`` (it was still running ``request_deadline_s`` after its arrival,
when the config sets one).
Routing counts stay in the executor's counters; the core reads them at its
own rate (every ``routing_interval_s``, when requests finish, when it goes
idle) and attaches them to that step's stats, never per step.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from contracts.errors import ValidationError
from contracts.placement import Placement
from engine.batch import SeqChunk
from engine.engine_types import EngineConfig, RequestOutput
from engine.executors import Executor
from engine.kv_cache import BlockManager
from engine.sampling import SamplingParams, TokenHistory, sample_each, token_logprobs
from engine.scheduler import Scheduler, SchedulerOutput, SeqStatus, Sequence, drain_time_s, resolve_max_model_len
from engine.stats import FinishedRequestStats, PlacementSwapStats, RequestTiming, RoutingDelta, StepStats

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


WARMUP_LONGEST_PROMPT = 128
"""The warm-up's longest prompt (tokens; at most one step's budget): its start-up stays a fraction of a second."""


@dataclass(slots=True)
class StepResult:
    """What one call of :meth:`EngineCore.step` produced."""

    outputs: list[RequestOutput] = field(default_factory=list)
    stats: StepStats | None = None
    """None when nothing ran and nothing changed."""


class EngineCore:
    """Continuous batching around an :class:`~engine.executors.Executor`; not thread-safe."""

    def __init__(
        self,
        executor: Executor,
        config: EngineConfig | None = None,
        *,
        eos_token_ids: Iterable[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.executor = executor
        self.config = config or EngineConfig()
        self.blocks = BlockManager(executor.num_blocks, executor.block_size,
                                   enable_prefix_caching=self.config.enable_prefix_caching)
        model_len = resolve_max_model_len(self.config.scheduler.max_model_len,
                                          executor.config.max_position_embeddings, self.blocks.capacity_tokens)
        self.scheduler = Scheduler(dataclasses.replace(self.config.scheduler, max_model_len=model_len), self.blocks)
        if self.context_note is not None:
            log.warning("engine core: context capped at %d tokens: %s; raise --kv-cache-mb to serve it all, or "
                        "set --max-model-len %d or less to choose it", self.max_model_len, self.context_note,
                        self.max_model_len)
        model_eos = executor.config.eos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids) if eos_token_ids is not None \
            else (() if model_eos is None else (model_eos,))
        """Tokens that end a sequence unless it ignores eos (:func:`engine.generation_config.eos_token_ids`)."""
        self._clock = clock
        self._requests: dict[str, Sequence] = {}
        self._seq_ids = itertools.count()
        self._pending_finished: list[FinishedRequestStats] = []
        self._pending_outputs: list[RequestOutput] = []
        self._pending_swap: PlacementSwapStats | None = None
        self._pending_routing: RoutingDelta | None = None
        self._last_routing_s = clock()
        self._finish_times_s: deque[float] = deque(maxlen=64)
        self._state_changed = False
        self.step_delay_s = 0.0
        """Fault injection for tests and drills: sleep this long before every model step."""
        self.fail_next_step = False
        """Fault injection for tests and drills: the next step raises outside the executor (a bug's shape)."""

    # ----------------------------------------------------------------- requests

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    @property
    def context_note(self) -> str | None:
        """Why the context is shorter than the checkpoint's (the KV cache caps it); None when it is not."""
        return self.scheduler.context_note

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *, arrival_s: float | None = None
    ) -> None:
        """Queue a request; raises ValidationError, PromptTooLongError or OverloadedError."""
        vocab = self.executor.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"stop_token_ids must be in [0, {vocab}); got {bad[:5]}")
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad:  # else the sampler fails the request after its prefill
            raise ValidationError(f"logit_bias token ids must be in [0, {vocab}); got {bad[:5]}")
        if request_id in self._requests:
            raise ValidationError(f"request_id {request_id!r} is already in flight")
        now = self._clock() if arrival_s is None else arrival_s
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            timing=RequestTiming(request_id=request_id, arrival_s=now, prompt_tokens=len(prompt_token_ids)),
        )
        self.scheduler.add(seq, retry_after_s=self._retry_after_s(self._clock()))
        self._requests[request_id] = seq

    def abort(self, request_id: str, reason: str = "abort", error: str | None = None) -> bool:
        """End a request now (client gone, or a stop the API side found); frees its KV blocks.

        Its final output is queued for the next :meth:`step` (or :meth:`take_outputs`).
        False if it already finished.
        """
        seq = self._requests.get(request_id)
        if seq is None:
            return False
        self.scheduler.finish(seq, reason)
        self._pending_outputs.append(self._finalize(seq, self._clock(), None, reason, error=error))
        return True

    def abort_all(self, reason: str = "abort", error: str | None = None) -> list[RequestOutput]:
        for request_id in list(self._requests):
            self.abort(request_id, reason, error)
        return self.take_outputs()

    def take_outputs(self) -> list[RequestOutput]:
        """Outputs queued outside a step (aborts), oldest first."""
        out, self._pending_outputs = self._pending_outputs, []
        return out

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def has_news(self) -> bool:
        """Whether an idle :meth:`step` would report something (finished requests, a swap)."""
        return self._state_changed or bool(self._pending_finished or self._pending_outputs)

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self.scheduler.running), len(self.scheduler.waiting)

    def kv_state(self) -> tuple[int, int]:
        """(blocks used, blocks total)."""
        return self.blocks.num_used, self.blocks.num_blocks

    def _retry_after_s(self, now: float) -> float:
        return drain_time_s(self._finish_times_s, len(self.scheduler.waiting), now)

    # ----------------------------------------------------------------- placement and routing

    @property
    def placement(self) -> Placement:
        return self.executor.placement

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        """Swap the placement between two steps; PlacementError (old placement kept) propagates.

        The counts routed under the old placement are read first, so the next
        stats carry them ahead of the swap.
        """
        self._pending_routing = _merge(self._pending_routing, self.executor.take_routing())
        swap = self.executor.apply_placement(placement)
        self._pending_swap = swap
        self._state_changed = True
        return swap

    def _routing(self, now: float, due: bool) -> RoutingDelta | None:
        """The routing counters, read at the loop's rate (``due``); with a swap, only those held back at it.

        The counts routed under the old placement go out with the swap, whatever the rate, as the
        window resets there; what was counted since is the new placement's, for the next read.
        """
        if self._pending_swap is not None:
            held, self._pending_routing = self._pending_routing, None
            return held
        if not due:
            return None
        self._last_routing_s = now
        delta = _merge(self._pending_routing, self.executor.take_routing())
        self._pending_routing = None
        return None if delta is None or delta.steps == 0 else delta

    def warm_up(self, requests: int, *, output_tokens: int = 8) -> int:
        """Run ``requests`` requests through the model and forget them; the steps it took.

        Prompts of rising lengths, all at once, so prefill chunks up to a full step's budget and
        growing decode batches pass through the model.  With more than one EP rank, a placement swap
        first (every expert to the next rank, and back): a replica's first swap paid for fresh
        memory and first sends, 0.5-0.65 s against 0.08 s for the next ones, and stalled every
        request in flight that long.  Nothing of them is left to see: no outputs, no finished-request,
        routing or swap statistics, no cached prefix blocks, no finish times.
        """
        if self.executor.num_ranks > 1:
            original = self.placement
            rolled = np.roll(original.phy2log, original.slots_per_rank, axis=1)
            self.apply_placement(Placement(phy2log=rolled, num_ranks=original.num_ranks))
            self.apply_placement(original)
        # A context of a few tokens (a tiny KV budget) shortens the requests: a prompt of one token and
        # the rest of the context to generate, never a refusal of the warm-up's own prompt.
        output_tokens = min(output_tokens, self.max_model_len - 1)
        if output_tokens < 1:
            return 0  # a context of one token holds no request at all
        longest = min(self.scheduler.config.max_num_batched_tokens, WARMUP_LONGEST_PROMPT,
                      self.max_model_len - output_tokens)
        vocab = self.executor.config.vocab_size
        params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
        prompts = [[(7 * i + j) % vocab for j in range(max(1, (i + 1) * longest // requests))]
                   for i in range(requests)]
        steps = 0
        while prompts or self.scheduler.has_work():
            # As the queue takes them: a small ``max_waiting`` would refuse them all at once.
            while prompts and self.scheduler.can_admit():
                self.add_request(f"warmup-{requests - len(prompts)}", prompts.pop(0), params)
            self.step()
            steps += 1
        self.take_outputs()
        self._pending_finished.clear()
        self._pending_routing = None
        self._pending_swap = None
        self.executor.take_routing()
        self.blocks.reset_prefix_cache()
        self._finish_times_s.clear()
        self._state_changed = False
        return steps

    # ----------------------------------------------------------------- the step

    def flush(self) -> StepResult:
        """What happened outside a step (aborts, a placement swap), as outputs and stats, without running one."""
        result = StepResult(outputs=self.take_outputs())
        if result.outputs or self._state_changed or self._pending_finished:
            result.stats = self._stats(self._clock(), 0.0, None, 0, (), ())
        return result

    def step(self) -> StepResult:
        """Run one step if there is work; else report what changed while idle.

        A step that raises puts back the outputs it had (the final outputs of aborts among them) for the
        next step or flush: whoever handles the failure, every request ends with exactly one final output.
        """
        if self.config.request_deadline_s is not None:
            self._expire(self._clock() - self.config.request_deadline_s)
        result = StepResult(outputs=self.take_outputs())
        try:
            self._run_step(result)
        except BaseException:
            self._pending_outputs[:0] = result.outputs
            raise
        return result

    def _run_step(self, result: StepResult) -> None:
        if not self.scheduler.has_work():
            if self._state_changed or self._pending_finished or result.outputs:
                result.stats = self._stats(self._clock(), 0.0, None, 0, (), ())
            return
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("injected step fault")
        out = self.scheduler.schedule()
        started_s = self._clock()
        for chunk in out.scheduled:
            if chunk.seq.timing.scheduled_s is None:
                chunk.seq.timing.scheduled_s = started_s
        if not out.plan.chunks:
            return
        try:
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            logits = self.executor.execute(out.plan)
        except Exception:
            log.exception("executor failed a step")
            self.scheduler.drop_unwritten(out)
            for chunk in out.scheduled:
                self.abort(chunk.seq.request_id, "error", error="the model step failed")
            result.outputs.extend(self.take_outputs())
            result.stats = self._stats(self._clock(), self._clock() - started_s, out, 0, (), ())
            return
        self._finish_step(out, logits, started_s, result)

    def _expire(self, arrived_before_s: float) -> None:
        """End every request that arrived before ``arrived_before_s`` (its deadline has passed)."""
        late = [rid for rid, seq in self._requests.items() if seq.timing.arrival_s <= arrived_before_s]
        for request_id in late:
            self.abort(request_id, "deadline")

    def _finish_step(self, out: SchedulerOutput, logits: object, started_s: float, result: StepResult) -> None:
        import torch

        assert isinstance(logits, torch.Tensor)
        rows: list[int] = []
        sampled: list[Sequence] = []
        prompt_rows: list[tuple[Sequence, int, SeqChunk]] = []
        row = 0
        for chunk, plan_chunk in zip(out.scheduled, out.plan.chunks, strict=True):
            seq = chunk.seq
            running = seq.status is SeqStatus.RUNNING
            if plan_chunk.all_logits and running:
                prompt_rows.append((seq, row, plan_chunk))
            row += plan_chunk.num_logits
            if plan_chunk.needs_logits and running:
                rows.append(row - 1)
                sampled.append(seq)
            if running:
                seq.num_computed += chunk.num_tokens
        for seq, first_row, plan_chunk in prompt_rows:
            _record_prompt_logprobs(seq, logits, first_row, plan_chunk)
        if rows and len(rows) < logits.shape[0]:
            logits = logits[rows]
        histories = [TokenHistory(s.prompt_token_ids, s.output_token_ids) for s in sampled]
        tokens, failures = sample_each(logits, [s.sampler for s in sampled], histories,
                                       eos_token_ids=self.eos_token_ids) if rows else ([], {})
        wanted = [s.params.logprobs for s in sampled]
        logprobs = token_logprobs(logits, tokens, wanted) if any(k is not None for k in wanted) else {}
        now = self._clock()
        ttfts: list[float] = []
        itls: list[float] = []
        prompt_tokens = 0  # vLLM's count: each whole prompt (cached tokens too) once, with its first token
        for row, (seq, token) in enumerate(zip(sampled, tokens, strict=True)):
            if row in failures:  # this request alone ends; the others in the batch go on
                log.warning("sampling failed for %s: %s", seq.request_id, failures[row])
                self.scheduler.finish(seq, "error")
                result.outputs.append(self._finalize(seq, now, None, "error", error="sampling failed"))
                continue
            timing = seq.timing
            if timing.first_token_s is None:
                timing.first_token_s = now
                ttfts.append(now - timing.arrival_s)
                prompt_tokens += len(seq.prompt_token_ids)
            else:
                itls.append(now - timing.token_times_s[-1])
            timing.token_times_s.append(now)
            seq.output_token_ids.append(token)
            # The prompt's log-probabilities come with the first token (as vLLM sends them).
            prompt = tuple(seq.prompt_logprobs) \
                if seq.params.prompt_logprobs is not None and len(seq.output_token_ids) == 1 else None
            reason = self._stop_reason(seq, token)
            if reason is None:
                result.outputs.append(RequestOutput(seq.request_id, token, logprobs=logprobs.get(row),
                                                    prompt_logprobs=prompt))
                continue
            self.scheduler.finish(seq, reason)
            final = self._finalize(seq, now, token, reason)
            result.outputs.append(dataclasses.replace(final, logprobs=logprobs.get(row), prompt_logprobs=prompt))
        result.stats = self._stats(now, now - started_s, out, len(tokens) - len(failures), tuple(ttfts),
                                   tuple(itls), prompt_tokens=prompt_tokens)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= params.max_tokens:
            return "length"
        return None

    def _finalize(
        self, seq: Sequence, now: float, token: int | None, reason: str, *, error: str | None = None
    ) -> RequestOutput:
        """Record the request's end; its final output (exactly once)."""
        self._requests.pop(seq.request_id, None)
        seq.timing.finished_s = now
        self._finish_times_s.append(now)
        self._pending_finished.append(_finished_stats(seq, now, reason))
        self._state_changed = True
        return RequestOutput(
            seq.request_id,
            token,
            finished=True,
            finish_reason=reason,
            is_stop_token=reason == "stop" and token is not None,
            error=error,
            prompt_tokens=len(seq.prompt_token_ids),
            generation_tokens=len(seq.output_token_ids),
        )

    def _stats(
        self,
        now: float,
        duration_s: float,
        out: SchedulerOutput | None,
        generation_tokens: int,
        ttfts: tuple[float, ...],
        itls: tuple[float, ...],
        *,
        prompt_tokens: int = 0,
    ) -> StepStats:
        finished = tuple(self._pending_finished)
        self._pending_finished.clear()
        # Read every ``routing_interval_s``, when requests finish (so their counts are published with
        # them), and when the engine goes idle.
        due = bool(finished) or not self.scheduler.has_work() \
            or now - self._last_routing_s >= self.config.routing_interval_s
        routing = self._routing(now, due)
        swap, self._pending_swap = self._pending_swap, None
        # A step ran after the swap, and its counts were due: an idle engine reports once more, with them.
        self._state_changed = swap is not None and out is not None and due
        return StepStats(
            now_s=now,
            step_duration_s=duration_s,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.blocks.usage,
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            ttfts_s=ttfts,
            itls_s=itls,
            num_preemptions=out.num_preemptions if out is not None else 0,
            prefix_cache_queries=out.prefix_cache_queries if out is not None else 0,
            prefix_cache_hits=out.prefix_cache_hits if out is not None else 0,
            finished=finished,
            routing=routing,
            placement_swap=swap,
        )


def _record_prompt_logprobs(seq: Sequence, logits: torch.Tensor, first_row: int, chunk: SeqChunk) -> None:
    """Append the log-probabilities of the prompt tokens this chunk's logits predict (rows from ``first_row``).

    The logits at position ``p`` predict prompt token ``p + 1``; positions
    already recorded (a chunk recomputed after a preemption) are skipped.
    """
    start = len(seq.prompt_logprobs)
    stop = min(chunk.num_computed + len(chunk.token_ids), len(seq.prompt_token_ids) - 1)
    if start < chunk.num_computed or stop <= start:
        return
    first = first_row + start - chunk.num_computed
    count = stop - start
    k = seq.params.prompt_logprobs
    found = token_logprobs(logits[first : first + count], seq.prompt_token_ids[start + 1 : stop + 1], [k] * count)
    seq.prompt_logprobs.extend(found[i] for i in range(count))


def _merge(a: RoutingDelta | None, b: RoutingDelta | None) -> RoutingDelta | None:
    if a is None or b is None:
        return a if b is None else b
    return RoutingDelta(a.expert_tokens + b.expert_tokens, a.rank_tokens + b.rank_tokens, a.steps + b.steps)


def _finished_stats(seq: Sequence, now: float, reason: str) -> FinishedRequestStats:
    timing = seq.timing
    itls = timing.itls_s
    scheduled = timing.scheduled_s if timing.scheduled_s is not None else now
    first = timing.first_token_s
    return FinishedRequestStats(
        request_id=seq.request_id,
        finish_reason=reason,
        prompt_tokens=len(seq.prompt_token_ids),
        generation_tokens=len(seq.output_token_ids),
        e2e_s=now - timing.arrival_s,
        queue_s=scheduled - timing.arrival_s,
        prefill_s=(first if first is not None else now) - scheduled,
        decode_s=0.0 if first is None else now - first,
        ttft_s=timing.ttft_s,
        mean_itl_s=float(np.mean(itls)) if itls else None,
    )


__all__ = ["EngineCore", "StepResult"]
