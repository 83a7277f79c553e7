"""The engine core on a thread of this process, with thread-safe methods and output callbacks.

:class:`LLMEngine` drives an :class:`~engine.core.EngineCore` from one
background thread.  Other threads talk to it only through thread-safe
methods: :meth:`LLMEngine.add_request`, :meth:`LLMEngine.abort` and
:meth:`LLMEngine.request_placement`.  One lock guards the core; outputs go to
each request's callback and statistics to the registered
:class:`~engine.stats.StatsSink` objects, outside the lock.

The server runs the core in its own process instead (:mod:`engine.core_proc`,
:mod:`engine.client`); this in-process driver serves the unit tests and
embedding in other Python programs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from contracts.errors import UnavailableError
from contracts.placement import Placement
from engine.core import EngineCore
from engine.engine_types import EngineConfig, ExpertLoad, OutputCallback, RequestOutput
from engine.executors import Executor
from engine.expert_load import ExpertLoadTracker, publish_step
from engine.kv_cache import BlockManager
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.stats import PlacementSwapStats, StatsSink, StepStats

log = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching engine around an :class:`~engine.executors.Executor`, on a thread."""

    def __init__(
        self,
        executor: Executor,
        config: EngineConfig | None = None,
        *,
        sinks: Iterable[StatsSink] = (),
        eos_token_ids: Iterable[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = EngineCore(executor, config, eos_token_ids=eos_token_ids, clock=clock)
        self.executor = executor
        self.config = self.core.config
        self._sinks: list[StatsSink] = list(sinks)
        self._lock = threading.Condition()
        self._callbacks: dict[str, OutputCallback] = {}
        self._placement_requests: deque[tuple[Placement, Future[PlacementSwapStats]]] = deque()
        self._load = ExpertLoadTracker(self.config.routing_window_steps)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def blocks(self) -> BlockManager:
        return self.core.blocks

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

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
            outputs = self.core.abort_all("abort")
            pending = list(self._placement_requests)
            self._placement_requests.clear()
        self._deliver(outputs)
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
        if not self.is_alive:
            raise UnavailableError("the engine loop is not running")
        request_id = request_id or f"cmpl-{uuid.uuid4().hex}"
        with self._lock:
            self.core.add_request(request_id, prompt_token_ids, params)
            self._callbacks[request_id] = on_output
            self._lock.notify_all()
        return request_id

    def abort(self, request_id: str) -> bool:
        """Abort a request (client went away); frees its KV blocks. False if it already finished."""
        with self._lock:
            found = self.core.abort(request_id)
            outputs = self.core.take_outputs()
            self._lock.notify_all()
        self._deliver(outputs)
        return found

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
        return self._load.snapshot()

    def kv_state(self) -> tuple[int, int]:
        """(blocks used, blocks total)."""
        with self._lock:
            return self.core.kv_state()

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            return self.core.num_requests()

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._apply_placements()
                self._step()
            except Exception:  # the loop must survive anything: every request still finishes
                log.exception("engine step failed")
                with self._lock:
                    outputs = self.core.abort_all("error", error="engine step failed")
                self._deliver(outputs)

    def _apply_placements(self) -> None:
        with self._lock:
            pending = list(self._placement_requests)
            self._placement_requests.clear()
            for placement, future in pending:
                try:
                    future.set_result(self.core.apply_placement(placement))
                except Exception as exc:
                    future.set_exception(exc)

    def _step(self) -> None:
        with self._lock:
            if not (self.core.has_work() or self.core.has_news()):
                self._lock.wait(self.config.idle_wait_s)
                return
            result = self.core.step()
        if result.stats is not None:
            self._emit(result.stats)
        self._deliver(result.outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for event in outputs:
            callback = self._callbacks.get(event.request_id)
            if callback is None:
                continue
            if event.finished:
                self._callbacks.pop(event.request_id, None)
            try:
                callback(event)
            except Exception:  # a consumer that went away must not stop the loop
                log.exception("output callback failed for %s", event.request_id)

    def _emit(self, stats: StepStats) -> None:
        publish_step(stats, self._load, self._sinks)


__all__ = ["EngineConfig", "ExpertLoad", "LLMEngine", "OutputCallback", "RequestOutput"]
