"""One request's outputs as the API process reads them, and their delivery from the client's receiver thread."""

from __future__ import annotations

import asyncio
import contextlib

from contracts.errors import MoesloError
from engine.engine_types import RequestOutput
from engine.stats import FinishedRequestStats


class RequestStream:
    """One request's outputs, read on the event loop that added it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, *, arrival_s: float = 0.0,
                 prompt_tokens: int = 0) -> None:  # fmt: skip
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | MoesloError] = asyncio.Queue()
        self.finished = False
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        """Tokens the core sent for it (counted on delivery): what a request failed here had generated."""

    def lost(self, finish_reason: str, now_s: float) -> FinishedRequestStats:
        """This request as the stats see one that ended here, not in the core (which died)."""
        return FinishedRequestStats(
            request_id=self.request_id, finish_reason=finish_reason, prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generated, e2e_s=max(0.0, now_s - self.arrival_s), queue_s=0.0, prefill_s=0.0,
            decode_s=0.0, ttft_s=None, mean_itl_s=None,
        )

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


__all__ = ["RequestStream", "deliver"]
