"""One request's outputs as the API process reads them, and their delivery from the client's receiver thread.

An OpenAI request of several choices (``n``, a list of prompts) is one
request in the core per choice; a :class:`ChoiceGroup` gathers them back into
one request for the statistics observed once per API request.

A request whose API side looks for stop strings ends, in the statistics, as
its client saw it (vLLM's output processor sets ``stop`` before it records a
finished request): a stop string found makes it ``stop`` with the tokens up
to it, whatever the core reported (``length`` when the stop string was in the
last allowed token; the tokens it generated before the stop reached it).  So
its :class:`RequestStream` holds the core's finished statistics until the API
side has read its final output (:meth:`RequestStream.settle`), unless a stop
string was found before they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import NamedTuple

from contracts.errors import MoesloError
from engine.engine_types import RequestOutput
from engine.stats import TEXT_COMPLETION, ApiRequestStats, EndedChoice, FinishedRequestStats


class ChoiceGroup:
    """The choices of one OpenAI request, until every one has ended.

    The API sends the choices to the core one by one (each :meth:`join`\\ s
    when sent), then :meth:`seal`\\ s the group.  Each choice ends on its own:
    reported by the core (finished or aborted), refused by it, or failed in the
    API process.  Once the group is sealed and every choice sent has ended, its
    :class:`~engine.stats.ApiRequestStats` go out once, to the ``publish`` of
    the client that ran the choices.  Any thread may call any method.
    """

    def __init__(self, response_id: str, operation: str = TEXT_COMPLETION, n: int = 1) -> None:
        self.response_id = response_id
        self.operation = operation
        self.n = n
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._ended: list[EndedChoice] = []
        self._sealed = self._published = False
        self._publish: Callable[[ApiRequestStats], None] | None = None

    def join(self, index: int, publish: Callable[[ApiRequestStats], None]) -> None:
        """Choice ``index`` is being sent to the core; ``publish`` takes the request's stats once all have ended."""
        with self._lock:
            self._running.add(index)
            self._publish = publish

    def end(self, index: int, ended: EndedChoice | None) -> None:
        """Choice ``index`` ended (None: it never ran, refused by the core or never sent)."""
        with self._lock:
            self._running.discard(index)
            if ended is not None:
                self._ended.append(ended)
        self._publish_if_done()

    def seal(self) -> None:
        """No more choices will be sent."""
        with self._lock:
            self._sealed = True
        self._publish_if_done()

    def annotate(self, stats: FinishedRequestStats) -> FinishedRequestStats:
        """One choice's stats as part of this request (its operation and the response's id)."""
        return dataclasses.replace(stats, operation=self.operation, response_id=self.response_id)

    def _publish_if_done(self) -> None:
        with self._lock:
            if not self._sealed or self._running or self._published or not self._ended or self._publish is None:
                return
            self._published = True
            stats = ApiRequestStats(self.response_id, self.operation, self.n,
                                    tuple(sorted(self._ended, key=lambda c: c.index)))  # fmt: skip
            publish = self._publish
        publish(stats)


class SeenFinish(NamedTuple):
    """A finished request's statistics as its client saw it."""

    stats: FinishedRequestStats
    end_s: float
    """Monotonic time the core ended it."""
    uncounted: int
    """Tokens the core generated that its client never got, still to be left out of the step counts."""


class RequestStream:
    """One request's outputs, read on the event loop that added it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, *, arrival_s: float = 0.0,
                 prompt_tokens: int = 0, group: ChoiceGroup | None = None, choice: int = 0,
                 on_seen: Callable[[SeenFinish], None] | None = None) -> None:  # fmt: skip
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | MoesloError] = asyncio.Queue()
        self.finished = False
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        """Tokens the core sent for it (counted on delivery): what a request failed here had generated."""
        self.group = group
        """The OpenAI request it is choice ``choice`` of (None: a request of its own)."""
        self.choice = choice
        self.on_seen = on_seen
        """Where finished statistics held for the API side's verdict go (None: its API side checks no stop
        strings, and nothing is held)."""
        self.stopped_at: int | None = None
        """The tokens its client got up to the stop string its API side found (None: none found)."""
        self.unseen = 0
        """Tokens that came after that stop string, left out of their step's count when they came."""
        self._lock = threading.Lock()
        self._held: tuple[FinishedRequestStats, float] | None = None
        self._read = False
        """Its API side read its final output, or stopped reading: nothing waits for it any more."""

    def join(self, publish: Callable[[ApiRequestStats], None]) -> None:
        """It is being sent to the core: its OpenAI request (if any) counts it, and will go to ``publish``."""
        if self.group is not None:
            self.group.join(self.choice, publish)

    def finish(self, stats: FinishedRequestStats, end_s: float) -> FinishedRequestStats:
        """The core reported it ended at ``end_s``: its stats as the choice they are (its OpenAI request learns
        it ended)."""
        return self._end(stats, end_s, reported=True)

    def stop_found(self, tokens: int) -> None:
        """Its API side found a stop string after its client got ``tokens`` tokens (on the event loop)."""
        with self._lock:
            self.stopped_at = tokens

    def seen(self, stats: FinishedRequestStats, end_s: float) -> SeenFinish | None:
        """The core reported it ended at ``end_s``: its statistics as its client saw it, or None while they wait
        for the API side's verdict (:meth:`settle`)."""
        with self._lock:
            if self.on_seen is not None and self.stopped_at is None and not self._read:
                self._held = (stats, end_s)
                return None
        return self._as_seen(stats, end_s, None)

    def settle(self, finish_reason: str, generation_tokens: int) -> None:
        """Its API side read the final output: for its client the request ended with ``finish_reason`` after
        ``generation_tokens`` tokens (on the event loop)."""
        self._release((finish_reason, generation_tokens))

    def stop_reading(self) -> None:
        """Its API side is done with it, final output read or not (its response ended)."""
        self._release(None)

    def _release(self, verdict: tuple[str, int] | None) -> None:
        with self._lock:
            self._read = True
            held, self._held = self._held, None
        if held is not None and self.on_seen is not None:
            self.on_seen(self._as_seen(*held, verdict))

    def _as_seen(self, core: FinishedRequestStats, end_s: float, verdict: tuple[str, int] | None) -> SeenFinish:
        """``core``'s statistics as its client saw the request end (``verdict``; None: as far as known here)."""
        if verdict is None and self.stopped_at is not None and core.finish_reason != "error":
            verdict = ("stop", self.stopped_at)  # as the API side rewrites the final output
        if verdict is None:
            return SeenFinish(self.finish(core, end_s), end_s, 0)
        reason, tokens = verdict
        seen = dataclasses.replace(core, finish_reason=reason, generation_tokens=tokens)
        return SeenFinish(self.finish(seen, end_s), end_s, max(0, core.generation_tokens - tokens - self.unseen))

    def lost(self, finish_reason: str, now_s: float) -> FinishedRequestStats:
        """This request as the stats see one that ended here, not in the core (which died); its OpenAI request
        learns it ended."""
        return self._end(FinishedRequestStats(
            request_id=self.request_id, finish_reason=finish_reason, prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generated, e2e_s=max(0.0, now_s - self.arrival_s), queue_s=0.0, prefill_s=0.0,
            decode_s=0.0, ttft_s=None, mean_itl_s=None,
        ), now_s, reported=False)

    def refused(self) -> None:
        """It never ran (the core refused it, or it was never sent)."""
        if self.group is not None:
            self.group.end(self.choice, None)

    def _end(self, stats: FinishedRequestStats, end_s: float, *, reported: bool) -> FinishedRequestStats:
        if self.group is None:
            return stats
        stats = self.group.annotate(stats)
        self.group.end(self.choice, EndedChoice(self.choice, end_s, stats, reported))
        return stats

    async def next(self) -> RequestOutput:
        """The next output; raises the error that ended the request (rejected, engine gone)."""
        item = await self.queue.get()
        if isinstance(item, MoesloError):
            self.finished = True
            raise item
        self.finished = item.finished
        return item


def deliver(loop: asyncio.AbstractEventLoop, batch: list[tuple[RequestStream, RequestOutput | MoesloError]]) -> None:
    """Put each item on its stream's queue, on ``loop`` (one wake-up for the whole batch)."""

    def put() -> None:
        for stream, item in batch:
            stream.queue.put_nowait(item)

    with contextlib.suppress(RuntimeError):  # that event loop has closed: nobody is reading
        loop.call_soon_threadsafe(put)


__all__ = ["ChoiceGroup", "RequestStream", "SeenFinish", "deliver"]
