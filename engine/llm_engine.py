"""The engine loop: scheduler -> executor -> sampler -> outputs and statistics.

One background thread owns the executor.  Other threads (the HTTP server's
event loop, the control endpoints) talk to it only through thread-safe
methods: :meth:`LLMEngine.add_request`, :meth:`LLMEngine.abort` and
:meth:`LLMEngine.request_placement`.  The scheduler's state is guarded by one
lock that the loop releases while the model runs, so admission and aborts
never wait for a step.

Every accepted request ends with exactly one final :class:`RequestOutput`
whose ``finish_reason`` is ``length``, ``stop``, ``abort`` or ``error``.
Statistics go to the registered :class:`~engine.stats.StatsSink` objects as
one :class:`~engine.stats.StepStats` per step; the engine never learns who
reads them.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from contracts.errors import UnavailableError
from contracts.imbalance import balancedness, imbalance_cv
from contracts.placement import Placement
from engine.engine_types import EngineConfig, ExpertLoad, OutputCallback, RequestOutput
from engine.executors import Executor
from engine.kv_cache import BlockManager
from engine.sampling import SamplingParams, sample
from engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SeqStatus, Sequence
from engine.stats import (
    FinishedRequestStats,
    PlacementSwapStats,
    RequestTiming,
    RoutingDelta,
    RoutingWindow,
    StatsSink,
    StepStats,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request:
    seq: Sequence
    on_output: OutputCallback


class LLMEngine:
    """Continuous-batching engine around an :class:`~engine.executors.Executor`."""

    def __init__(
        self,
        executor: Executor,
        config: EngineConfig | None = None,
        *,
        sinks: Iterable[StatsSink] = (),
        eos_token_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.executor = executor
        self.config = config or EngineConfig()
        model_len = min(self.config.scheduler.max_model_len, executor.config.max_position_embeddings)
        sched_config = SchedulerConfig(
            max_num_seqs=self.config.scheduler.max_num_seqs,
            max_num_batched_tokens=self.config.scheduler.max_num_batched_tokens,
            max_waiting=self.config.scheduler.max_waiting,
            max_model_len=model_len,
        )
        self.blocks = BlockManager(executor.num_blocks, executor.block_size)
        self.scheduler = Scheduler(sched_config, self.blocks)
        self.eos_token_id = executor.config.eos_token_id if eos_token_id is None else eos_token_id
        self._sinks: list[StatsSink] = list(sinks)
        self._clock = clock
        self._lock = threading.Condition()
        self._requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self._pending_finished: list[FinishedRequestStats] = []
        self._placement_requests: deque[tuple[Placement, Future[PlacementSwapStats]]] = deque()
        self._finish_times_s: deque[float] = deque(maxlen=64)
        self._routing_lock = threading.Lock()
        self._window: RoutingWindow | None = None
        self._steps_in_window = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_changed = False

    # ----------------------------------------------------------------- lifecycle

    def add_sink(self, sink: StatsSink) -> None:
        self._sinks.append(sink)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="moeslo-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self, *, shutdown_executor: bool = True, timeout_s: float = 30.0) -> None:
        """Stop the loop; requests still in flight finish with ``abort``."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            for request_id in list(self._requests):
                self._abort_locked(request_id, "abort")
            pending = list(self._placement_requests)
            self._placement_requests.clear()
        for _, future in pending:
            future.set_exception(UnavailableError("engine shut down before the placement was applied"))
        if shutdown_executor:
            self.executor.shutdown()

    # ----------------------------------------------------------------- requests

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        *,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; raises ValidationError, PromptTooLongError or OverloadedError."""
        from contracts.errors import ValidationError

        vocab = self.executor.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        if not self.is_alive:
            raise UnavailableError("the engine loop is not running")
        request_id = request_id or f"cmpl-{uuid.uuid4().hex}"
        now = self._clock()
        with self._lock:
            if request_id in self._requests:
                raise ValidationError(f"request_id {request_id!r} is already in flight")
            seq = Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                timing=RequestTiming(request_id=request_id, arrival_s=now, prompt_tokens=len(prompt_token_ids)),
            )
            self.scheduler.add(seq, retry_after_s=self._retry_after_s_locked(now))
            self._requests[request_id] = _Request(seq, on_output)
            self._lock.notify_all()
        return request_id

    def abort(self, request_id: str) -> bool:
        """Abort a request (client went away); frees its KV blocks. False if it already finished."""
        with self._lock:
            found = self._abort_locked(request_id, "abort")
            self._lock.notify_all()
        return found

    def _abort_locked(self, request_id: str, reason: str, error: str | None = None) -> bool:
        request = self._requests.get(request_id)
        if request is None:
            return False
        self.scheduler.finish(request.seq, reason)
        self._finalize_locked(request, self._clock(), None, reason, error=error)
        return True

    def _retry_after_s_locked(self, now: float) -> float:
        """Time until the queue has drained by one bound's worth, from the recent finish rate."""
        times = self._finish_times_s
        if len(times) >= 2 and now > times[0]:
            rate = len(times) / (now - times[0])
            return float(min(60.0, max(1.0, len(self.scheduler.waiting) / rate)))
        return 1.0

    # ----------------------------------------------------------------- placement and routing

    @property
    def placement(self) -> Placement:
        return self.executor.placement

    def request_placement(self, placement: Placement, timeout_s: float = 300.0) -> PlacementSwapStats:
        """Apply ``placement`` between two steps; PlacementError (old placement kept) propagates."""
        if not self.is_alive:
            raise UnavailableError("the engine loop is not running")
        future: Future[PlacementSwapStats] = Future()
        with self._lock:
            self._placement_requests.append((placement, future))
            self._lock.notify_all()
        return future.result(timeout_s)

    def expert_load(self) -> ExpertLoad | None:
        """The routing window, or None before the first routed step (or with routing stats off)."""
        with self._routing_lock:
            window = self._window
            if window is None:
                return None
            rank = window.rank_tokens
            return ExpertLoad(
                window_steps=window.window_steps,
                steps_in_window=self._steps_in_window,
                expert_tokens=window.expert_tokens,
                rank_tokens=rank,
                imbalance_cv=[float(x) for x in imbalance_cv(rank)],
                balancedness=[float(x) for x in balancedness(rank)],
            )

    def kv_state(self) -> tuple[int, int]:
        """(blocks used, blocks total)."""
        with self._lock:
            return self.blocks.num_used, self.blocks.num_blocks

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            return len(self.scheduler.running), len(self.scheduler.waiting)

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._apply_placements()
                self._step()
            except Exception:  # the loop must survive anything: every request still finishes
                log.exception("engine step failed")
                with self._lock:
                    for request_id in list(self._requests):
                        self._abort_locked(request_id, "error", error="engine step failed")

    def _apply_placements(self) -> None:
        with self._lock:
            pending = list(self._placement_requests)
            self._placement_requests.clear()
        for placement, future in pending:
            try:
                swap = self.executor.apply_placement(placement)
            except Exception as exc:
                future.set_exception(exc)
                continue
            with self._routing_lock:
                if self._window is not None:
                    self._window.reset()
                self._steps_in_window = 0
            future.set_result(swap)
            self._emit(self._idle_stats(placement_swap=swap))

    def _step(self) -> None:
        with self._lock:
            idle = not self.scheduler.has_work()
            if idle and not (self._state_changed or self._pending_finished):
                self._lock.wait(self.config.idle_wait_s)
                return
            if idle:
                stats = self._idle_stats_locked()
            else:
                out = self.scheduler.schedule()
                started_s = self._clock()
                for chunk in out.scheduled:
                    if chunk.seq.timing.scheduled_s is None:
                        chunk.seq.timing.scheduled_s = started_s
        if idle:
            self._emit(stats)
            return
        if not out.plan.chunks:
            return
        try:
            logits = self.executor.execute(out.plan)
        except Exception as exc:
            log.exception("executor failed a step")
            with self._lock:
                for chunk in out.scheduled:
                    self._abort_locked(chunk.seq.request_id, "error", error=f"model step failed: {exc}")
            return
        self._emit(self._finish_step(out, logits, started_s))

    def _finish_step(self, out: SchedulerOutput, logits: object, started_s: float) -> StepStats:
        import torch

        assert isinstance(logits, torch.Tensor)
        now = self._clock()
        ttfts: list[float] = []
        itls: list[float] = []
        generation_tokens = 0
        events: list[tuple[OutputCallback, RequestOutput]] = []
        with self._lock:
            rows: list[int] = []
            sampled_seqs: list[Sequence] = []
            row = 0
            for chunk, plan_chunk in zip(out.scheduled, out.plan.chunks, strict=True):
                seq = chunk.seq
                if plan_chunk.needs_logits:
                    if seq.status is SeqStatus.RUNNING:
                        rows.append(row)
                        sampled_seqs.append(seq)
                    row += 1
                if seq.status is SeqStatus.RUNNING:
                    seq.num_computed += chunk.num_tokens
            tokens = sample(logits[rows], [s.sampler for s in sampled_seqs]) if rows else []
            for seq, token in zip(sampled_seqs, tokens, strict=True):
                timing = seq.timing
                if timing.first_token_s is None:
                    timing.first_token_s = now
                    ttfts.append(now - timing.arrival_s)
                else:
                    itls.append(now - timing.token_times_s[-1])
                timing.token_times_s.append(now)
                seq.output_token_ids.append(token)
                generation_tokens += 1
                request = self._requests[seq.request_id]
                reason = self._stop_reason(seq, token)
                if reason is None:
                    events.append((request.on_output, RequestOutput(seq.request_id, token)))
                    continue
                self.scheduler.finish(seq, reason)
                self._finalize_locked(request, now, token, reason, notify=False, events=events)
            finished = tuple(self._pending_finished)
            self._pending_finished.clear()
            stats = StepStats(
                now_s=now,
                step_duration_s=now - started_s,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                kv_cache_usage=self.blocks.usage,
                prompt_tokens=out.prompt_tokens,
                generation_tokens=generation_tokens,
                ttfts_s=tuple(ttfts),
                itls_s=tuple(itls),
                num_preemptions=out.num_preemptions,
                finished=finished,
            )
            self._state_changed = False
        for callback, event in events:
            _deliver(callback, event)
        # Outside the lock: with --ep N this may wait on the rank processes.
        return dataclasses.replace(stats, routing=self._take_routing())

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and self.eos_token_id is not None and token == self.eos_token_id:
            return "stop"
        if len(seq.output_token_ids) >= params.max_tokens:
            return "length"
        return None

    def _finalize_locked(
        self,
        request: _Request,
        now: float,
        token: int | None,
        reason: str,
        *,
        error: str | None = None,
        notify: bool = True,
        events: list[tuple[OutputCallback, RequestOutput]] | None = None,
    ) -> None:
        """Record the request's end and send its final output (exactly once)."""
        seq = request.seq
        self._requests.pop(seq.request_id, None)
        timing = seq.timing
        timing.finished_s = now
        self._finish_times_s.append(now)
        self._pending_finished.append(_finished_stats(seq, now, reason))
        self._state_changed = True
        event = RequestOutput(
            seq.request_id,
            token,
            finished=True,
            finish_reason=reason,
            is_stop_token=reason == "stop" and token is not None,
            error=error,
            prompt_tokens=len(seq.prompt_token_ids),
            generation_tokens=len(seq.output_token_ids),
        )
        if events is not None:
            events.append((request.on_output, event))
        if notify:
            _deliver(request.on_output, event)

    def _idle_stats_locked(self, placement_swap: PlacementSwapStats | None = None) -> StepStats:
        finished = tuple(self._pending_finished)
        self._pending_finished.clear()
        self._state_changed = False
        return StepStats(
            now_s=self._clock(),
            step_duration_s=0.0,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.blocks.usage,
            prompt_tokens=0,
            generation_tokens=0,
            finished=finished,
            placement_swap=placement_swap,
        )

    def _idle_stats(self, placement_swap: PlacementSwapStats | None = None) -> StepStats:
        with self._lock:
            return self._idle_stats_locked(placement_swap)

    def _take_routing(self) -> RoutingDelta | None:
        routing = self.executor.take_routing()
        if routing is not None:
            with self._routing_lock:
                if self._window is None:
                    layers, experts = routing.expert_tokens.shape
                    self._window = RoutingWindow(
                        layers, experts, routing.rank_tokens.shape[1], self.config.routing_window_steps
                    )
                self._window.add(routing)
                self._steps_in_window = min(self._steps_in_window + 1, self._window.window_steps)
        return routing

    def _emit(self, stats: StepStats) -> None:
        for sink in self._sinks:
            try:
                sink.record(stats)
            except Exception:  # a broken exporter must not stop serving
                log.exception("stats sink %r failed", sink)


def _deliver(callback: OutputCallback, event: RequestOutput) -> None:
    try:
        callback(event)
    except Exception:  # a consumer that went away must not stop the loop
        log.exception("output callback failed for %s", event.request_id)


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


__all__ = ["EngineConfig", "ExpertLoad", "LLMEngine", "OutputCallback", "RequestOutput"]
