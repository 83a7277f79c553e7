"""The API process's statistics: the core's steps to the sinks, with requests counted as their clients saw them.

A request whose API side looks for stop strings ends, for the sinks, as its
client saw it (:mod:`engine.request_stream`): its finished statistics may wait
for the API side's verdict, and then go out on their own, as the statistics
of an idle step (gauges as the last step left them, no tokens).  The tokens the
core generated after a stop string are left out of the generation tokens, as
vLLM's output processor ignores outputs after a stop: at once those that come
after the API side found the stop; the rest, found only once the request
ended, from the next steps' counts.  Every publication holds one lock, so the
sinks see one at a time and the gauges never go back to an older step's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Mapping

from engine.engine_types import RequestOutput
from engine.expert_load import ExpertLoadTracker, publish_step
from engine.request_stream import RequestStream, SeenFinish
from engine.stats import StatsSink, StepStats

log = logging.getLogger("moeslo.engine_client")


class StatsPublisher:
    """Steps and finished requests to every sink and the expert-load window; any thread may call it."""

    def __init__(self, sinks: Iterable[StatsSink], window_steps: int) -> None:
        self.sinks: list[StatsSink] = list(sinks)
        self.load = ExpertLoadTracker(window_steps)
        self._lock = threading.Lock()
        self._last: StepStats | None = None
        self._uncounted = 0
        """Tokens counted by the core that no client got, still to leave out of the next steps' counts."""

    def record_step(self, stats: StepStats, streams: Mapping[str, RequestStream],
                    outputs: Iterable[RequestOutput]) -> None:  # fmt: skip
        """One step's statistics; ``streams``: those of its outputs and finished requests still in flight."""
        unseen = 0
        for out in outputs:
            stream = streams.get(out.request_id)
            if out.token_id is not None and stream is not None and stream.stopped_at is not None:
                stream.unseen += 1  # after the stop string its API side found: its client never gets it
                unseen += 1
        finished = []
        for fin in stats.finished:
            stream = streams.get(fin.request_id)
            seen = SeenFinish(fin, stats.now_s, 0) if stream is None else stream.seen(fin, stats.now_s)
            if seen is not None:  # else held for the API side's verdict
                finished.append(seen.stats)
                unseen += seen.uncounted
        with self._lock:
            self._uncounted += unseen
            left_out = min(self._uncounted, stats.generation_tokens)
            self._uncounted -= left_out
            step = dataclasses.replace(stats, generation_tokens=stats.generation_tokens - left_out,
                                       finished=tuple(finished))
            self._publish(step)

    def record_seen(self, seen: SeenFinish) -> None:
        """A finished request held for its API side's verdict, now as its client saw it."""
        with self._lock:
            self._uncounted += seen.uncounted
            last = self._last
            self._publish(StepStats(
                now_s=seen.end_s, step_duration_s=0.0,
                num_running=0 if last is None else last.num_running,
                num_waiting=0 if last is None else last.num_waiting,
                kv_cache_usage=0.0 if last is None else last.kv_cache_usage,
                prompt_tokens=0, generation_tokens=0, finished=(seen.stats,),
            ))

    def to_sinks(self, method: str, *args: object) -> None:
        """Call ``method`` on every sink that has it (the optional parts of a stats sink)."""
        for sink in self.sinks:
            record = getattr(sink, method, None)
            if record is not None:
                try:
                    record(*args)
                except Exception:  # a broken exporter must not stop serving
                    log.exception("stats sink %r failed", sink)

    def _publish(self, step: StepStats) -> None:
        self._last = step
        publish_step(step, self.load, self.sinks)


__all__ = ["StatsPublisher"]
