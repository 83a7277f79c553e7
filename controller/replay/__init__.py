"""Trace replay: the fleet simulator that drives the production decision core over a request trace.

Traces themselves are read by :mod:`contracts.traces` (the load generator and the local stack read them too).
"""

from __future__ import annotations

from controller.replay.lengths import NAMED_LENGTHS, resolve_lengths

__all__ = [
    "NAMED_LENGTHS",
    "resolve_lengths",
]
