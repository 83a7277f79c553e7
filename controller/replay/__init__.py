"""Trace replay: trace readers and the fleet simulator that drives the production decision core."""

from __future__ import annotations

from controller.replay.lengths import NAMED_LENGTHS, resolve_lengths
from controller.replay.traces import (
    CountTrace,
    LengthDistribution,
    RequestTrace,
    Trace,
    load_request_trace,
    load_trace,
)

__all__ = [
    "NAMED_LENGTHS",
    "CountTrace",
    "LengthDistribution",
    "RequestTrace",
    "Trace",
    "load_request_trace",
    "load_trace",
    "resolve_lengths",
]
