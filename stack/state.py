"""What the local stack knows while it runs: its options, each look at the stack, and the events seen."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.loadgen import ArrivalProcess, RequestRecord


@dataclass(frozen=True, kw_only=True)
class StackOptions:
    duration_s: float = 120.0
    out: Path = Path("demo-out")
    """The run's folder; a relative one is made absolute against the current folder when the options are made."""
    checkpoint: Path | None = None
    """None: a fresh random checkpoint with a skewed router; a relative one is made absolute as ``out`` is."""
    ep: int = 2
    min_replicas: int = 1
    max_replicas: int = 2
    max_num_batched_tokens: int = 32
    """Each replica's step budget: prompts are prefilled in chunks of at most this many tokens beside the
    decodes, so a prefill step stays under the ITL objective (as Sarathi-Serve sizes its token budget
    from the inter-token SLO).  With rank processes a decode step took about 10 ms and a prompt token
    0.3 ms: a 64-token chunk made a 28 ms step, a 32-token one about 19 ms (colocated ranks halve the
    decode step; the budget was not measured again).  Measured on one replica (EP 2, one CPU) at
    3 requests/s, two rounds: 100 % of requests within both objectives with 32 against
    96-97 % with 64, and 98.5 % of gaps within 20 ms against 96.5 %; 24 raised TTFT and did worse."""
    cpus_per_replica: int = 1
    """CPUs pinned to each replica (its API, engine core and EP ranks share them): the host budget."""
    trace: Path | None = None
    """None: the bundled day of Azure 2024 request counts (its morning rise); a request trace
    (Azure 2023 format) is replayed as it is, time-compressed by ``speedup``."""
    trace_start_h: float = 4.0
    trace_span_h: float = 12.0
    """The window of a count trace compressed into ``duration_s`` (04:00 to 16:00: the morning rise)."""
    speedup: float = 1.0
    """Time compression of a request trace."""
    arrivals: ArrivalProcess = "even"
    """How a count trace's rates become arrivals: ``even`` keeps the smoothness of the trace at full volume
    (a day of a large service scaled down a thousandfold); ``poisson`` adds a small service's counting noise
    (:data:`harness.loadgen.ArrivalProcess`)."""
    base_load: float = 0.7
    """The quiet start of a count trace, as a share of the request rate one replica sustains within
    the objectives: what the controller's capacity model says, from the profile the stack measures,
    and at most what the replicas held there.  The bundled morning is 1.34x its start at
    28 s and 1.45x at 42 s (of 120), so at 0.7 the rise needs a second replica from about 30-40 s,
    before the fault; at 0.55 it peaked at 0.8 of one replica until the last 15 s."""
    length_scale: float = 0.1
    """Prompt and output lengths scaled down for a small CPU model."""
    inject_slowdown: bool = True
    slowdown_at_s: float = 62.0
    slowdown_for_s: float = 28.0
    """The injected fault: every replica's CPU throttled (as a CFS quota or a noisy neighbour would)."""
    profile_s: float = 5.0
    """Seconds of load per level of the start-up profile of the first replica."""
    prometheus: bool = True
    router: bool = True
    """Send the load through the entry router (``moeslo route --controller``, cost policy); False: the load
    generator picks the replica with the fewest requests in flight itself."""
    tick_interval_s: float = 2.0
    sample_interval_s: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        # Absolute from here on: the stack's processes run in the repository's root, not where `moeslo up` ran.
        object.__setattr__(self, "out", self.out.resolve())
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", self.checkpoint.resolve())

    @property
    def colocate_ranks(self) -> bool:
        """Fewer CPUs than ranks: the ranks' slots stay in the engine-core process (``--colocate-ranks``);
        rank processes sharing a CPU only take turns, with hand-offs between them."""
        return self.cpus_per_replica < self.ep

    @property
    def fault_in_load(self) -> bool:
        """A fault is injected: one planned at or past the end of the load is none (it began in the drain, after
        ``moeslo up`` had said there was no fault in the run)."""
        return self.inject_slowdown and self.slowdown_at_s < self.duration_s

    @property
    def ep_label(self) -> str:
        """How a replica's expert parallelism reads in progress lines."""
        return f"EP {self.ep}" + (", ranks in one process" if self.colocate_ranks else "")


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
    arrival_rps: float = 0.0
    """Requests sent per second over the last 10 s (what the forecast is scored against)."""
    noise_cv: list[float] = field(default_factory=list)
    forecast: dict[str, Any] | None = None
    """The controller's forecast (``/v1/status``): point, interval and sized rates one horizon ahead."""
    fault_requests: int = 0
    """Of the requests finished in the last 30 s (whose p99s these are), those the injected fault touched: for
    a while after it ends, the requests it delayed may set the p99s."""


@dataclass
class StackState:
    options: StackOptions
    started_s: float = field(default_factory=time.monotonic)
    started_wall_s: float = field(default_factory=time.time)
    """The wall clock at ``started_s``: what maps the times other processes stamp (a decision's ``at``) to stack
    seconds."""
    records: list[RequestRecord] = field(default_factory=list)
    done_at_s: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    seen_decisions: set[str] = field(default_factory=set)
    pages: list[dict[str, Any]] = field(default_factory=list)
    """Every post to the stack's webhook, pages and tickets alike (its ``receiver`` says which)."""
    engines: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    prometheus_url: str | None = None
    alertmanager_url: str | None = None
    controller_url: str = ""
    router_url: str | None = None
    """The entry router the load goes through (None: straight to the replicas)."""
    routed: set[str] = field(default_factory=set)
    """Replicas the router sends requests to, at the last look."""
    router_requests: dict[str, int] = field(default_factory=dict)
    """The router's request counts at the end, by ``replica decision outcome``."""
    printed_events: int = 0
    load_started_s: float = 0.0
    planned_arrivals_s: list[float] = field(default_factory=list)
    """When each request of the plan is sent, from the start of the load."""
    fault: tuple[float, float] | None = None
    """(start, end) of the injected fault, in stack seconds."""
    profile: dict[str, Any] | None = None
    """The first replica's measured profile and the load sized from it."""
    unfinished: int = 0
    """Requests still in flight when the run ended (cancelled, counted apart from failures)."""
    interrupted: bool = False
    """The load was cut short (Ctrl-C, SIGTERM): the results are of the run until then."""
    controller_exit: tuple[float, int] | None = None
    """(stack seconds, exit code) when the controller exited during the run: the control loop was dead after."""
    controller_unanswered: int = 0
    """Looks at the controller (its status) that got no answer."""
    stopping_s: float | None = None
    """When the stack began to stop its processes, in stack seconds."""
    still_running: list[str] = field(default_factory=list)
    """Processes the stop could not end (empty: every one is gone)."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started_s

    def event(self, text: str, at_s: float | None = None) -> None:
        """A line of the run's story, at ``at_s`` (stack seconds) when it happened before it was seen, else now."""
        self.events.append((self.elapsed() if at_s is None else at_s, text))

    def from_wall(self, wall_s: float) -> float:
        """Stack seconds of a wall-clock time (``time.time()``'s scale)."""
        return wall_s - self.started_wall_s


__all__ = ["Sample", "StackOptions", "StackState"]
