"""A replica's decode clock: how much decoding its requests have had time for, given its prefills.

A replica interleaves prefill chunks with its decode steps, so every sequence decoding while a
prompt is prefilled advances more slowly: over a prefill interval of ``length`` seconds whose
chunks compute for ``compute`` seconds, the decoders get ``length - compute`` seconds of decode
steps.  The clock maps wall time to decode time (``virtual``) and back (``real``): a request that
needs ``d`` seconds of decode steps from its first token ``f`` finishes at
``real(virtual(f) + d)``, however many prompts the replica prefills meanwhile.

Prefills are added in time order (the replica prefills first come, first served), so the clock is
final up to the end of the last one added: the fleet keys its decode heap by decode time and
turns it into wall time only when a request is released.
"""

from __future__ import annotations

import bisect

__all__ = ["DecodeClock"]

_TRIM_AFTER = 256
"""Breakpoints older than the earliest time still asked about are dropped in batches of at least this many."""


class DecodeClock:
    """Piecewise-linear, non-decreasing map from wall time to decode time (slope 1 outside prefills)."""

    __slots__ = ("_decode", "_times")

    def __init__(self) -> None:
        self._times: list[float] = [0.0]
        self._decode: list[float] = [0.0]

    def add_prefill(self, start_s: float, end_s: float, compute_s: float) -> None:
        """A prompt prefilled over [``start_s``, ``end_s``), its chunks computing ``compute_s`` of that."""
        start_s = max(start_s, self._times[-1])
        if end_s <= start_s:
            return
        compute_s = min(max(compute_s, 0.0), end_s - start_s)
        at_start = self.virtual(start_s)
        if start_s > self._times[-1]:
            self._times.append(start_s)
            self._decode.append(at_start)
        self._times.append(end_s)
        self._decode.append(at_start + (end_s - start_s) - compute_s)

    def virtual(self, t: float) -> float:
        """Decode time at wall time ``t``."""
        times, decode = self._times, self._decode
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return decode[0] - (times[0] - t)
        if i == len(times) - 1:
            return decode[i] + (t - times[i])
        span = times[i + 1] - times[i]
        return decode[i] + (decode[i + 1] - decode[i]) * (t - times[i]) / span

    def real(self, v: float) -> float:
        """The earliest wall time at which decode time reaches ``v``."""
        times, decode = self._times, self._decode
        i = bisect.bisect_left(decode, v)
        if i == 0:
            return times[0] - (decode[0] - v)
        if i == len(decode):
            return times[-1] + (v - decode[-1])
        gained = decode[i] - decode[i - 1]  # > 0: bisect_left found decode[i - 1] < v <= decode[i]
        return times[i - 1] + (times[i] - times[i - 1]) * (v - decode[i - 1]) / gained

    def trim(self, t: float) -> None:
        """Forget breakpoints nobody asks about again: every later question is at or after ``t``."""
        i = bisect.bisect_right(self._times, t) - 1
        if i >= _TRIM_AFTER:
            del self._times[:i]
            del self._decode[:i]
