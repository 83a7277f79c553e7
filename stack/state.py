"""What the local stack knows while it runs: its options, each look at the stack, and the events seen."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.loadgen import RequestRecord


@dataclass(frozen=True, kw_only=True)
class StackOptions:
    duration_s: float = 120.0
    out: Path = Path("demo-out")
    checkpoint: Path | None = None
    """None: a fresh random checkpoint with a skewed router."""
    ep: int = 2
    min_replicas: int = 1
    max_replicas: int = 2
    speedup: float = 1.0
    """Trace time compression."""
    length_scale: float = 0.1
    """Prompt and output lengths scaled down for a small CPU model."""
    trace: Path | None = None
    prometheus: bool = True
    tick_interval_s: float = 5.0
    sample_interval_s: float = 2.0
    seed: int = 0


@dataclass
class Sample:
    """One look at the stack (the live view's row, a point in the plots)."""

    t_s: float
    ttft_p99_s: float | None
    itl_p99_s: float | None
    requests_ok: int
    requests_failed: int
    imbalance_cv: list[float]
    current_replicas: int | None
    desired_replicas: int | None
    ready_engines: int
    alerts: list[str]


@dataclass
class StackState:
    options: StackOptions
    started_s: float = field(default_factory=time.monotonic)
    records: list[RequestRecord] = field(default_factory=list)
    done_at_s: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    seen_decisions: set[str] = field(default_factory=set)
    pages: list[dict[str, Any]] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    prometheus_url: str | None = None
    alertmanager_url: str | None = None
    controller_url: str = ""
    printed_events: int = 0
    load_started_s: float = 0.0
    unfinished: int = 0
    """Requests still in flight when the run ended (cancelled, counted apart from failures)."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started_s

    def event(self, text: str) -> None:
        self.events.append((self.elapsed(), text))


__all__ = ["Sample", "StackOptions", "StackState"]
