"""The API process's sending end of the link to the engine core: it never blocks its caller.

Requests, aborts and calls go to the core over a ZeroMQ PUSH socket, most of them from the event
loop.  Its queue is bounded (ZeroMQ's high-water mark, 1000 messages, and the kernel's socket buffer);
a core that stops reading (stopped, hung in a step) fills it after some hundreds of requests, and a
blocking send would then stop the event loop, ``/health`` and ``/metrics`` with it.  So every send is
non-blocking:

- a request or call that finds the queue full is refused (the client answers 503 with
  ``Retry-After``);
- an abort that finds it full is kept and sent, in order, before anything else once there is room
  (the client's receiver thread retries every 0.1 s); it is dropped when its request finishes first
  or the core is gone.  The first abort kept after the queue had room is logged, as is the moment
  the kept ones are sent.

The socket is used under one lock, from whichever thread sends (ZeroMQ sockets are not thread-safe).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import zmq

from engine import wire

log = logging.getLogger("moeslo.engine_client")


class CoreInputs:
    """Non-blocking sends to the engine core, with the aborts that found no room kept for later."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self._socket = socket
        self._lock = threading.Lock()
        self._aborts: dict[str, str] = {}
        """Aborts not yet sent: request id -> reason, oldest first."""

    def send(self, msg: list[Any]) -> bool:
        """Send ``msg`` after any kept aborts; False (nothing sent) when the queue to the core is full."""
        data = wire.pack(msg)
        with self._lock:
            if not self._flush():
                return False
            return self._try(data)

    def send_until(self, msg: list[Any], deadline: float) -> bool:
        """Send ``msg``, retrying while the queue is full until ``deadline`` (``time.monotonic``); sent?"""
        while not self.send(msg):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def abort(self, request_ids: list[str], reason: str) -> None:
        """End these requests in the core: now, or as soon as its queue has room."""
        with self._lock:
            if self._flush() and self._try(wire.pack([wire.ABORT, request_ids, reason])):
                return
            if not self._aborts:
                log.warning("the engine core's input queue is full (the core is not reading); "
                            "aborts wait to be sent")
            self._aborts.update(dict.fromkeys(request_ids, reason))

    @property
    def pending_aborts(self) -> int:
        return len(self._aborts)

    def flush(self) -> None:
        """Send the kept aborts that now find room."""
        with self._lock:
            self._flush()

    def forget(self, request_id: str) -> None:
        """The request has finished: an abort still kept for it is no longer needed."""
        if self._aborts:
            with self._lock:
                self._aborts.pop(request_id, None)

    def clear(self) -> None:
        """The core is gone: nothing kept will be sent."""
        with self._lock:
            self._aborts.clear()

    def _flush(self) -> bool:
        """Send the kept aborts, one message per reason, oldest first; True when none is left."""
        if not self._aborts:
            return True
        by_reason: dict[str, list[str]] = {}
        for request_id, reason in self._aborts.items():
            by_reason.setdefault(reason, []).append(request_id)
        for reason, request_ids in by_reason.items():
            if not self._try(wire.pack([wire.ABORT, request_ids, reason])):
                return False
            for request_id in request_ids:
                del self._aborts[request_id]
        log.info("the engine core reads its input again; the aborts that waited are sent")
        return True

    def _try(self, data: bytes) -> bool:
        try:
            self._socket.send(data, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True


__all__ = ["CoreInputs"]
