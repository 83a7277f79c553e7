"""What a worker records about the expert rearrangements of its engine (plain data; exporters publish it).

One :class:`PlacementLog` per counting worker.  The trigger
(``engine.vllm_plugin.eplb_control``) records each request; the snapshot
builder records each rearrangement when it sees EPLB's map change (with the
trigger's figures where the trigger asked for it, else vLLM's own) and adds
the *measured* balance since the last rearrangement (the routing counted
after it, on the new placement) at every flush, so ``moe_placement_*`` shows
predicted and measured balance before and after side by side.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.catalogue import SWAP_DURATION_BUCKETS_S
from contracts.imbalance import balancedness, imbalance_cv

BALANCE_SOURCES = ("predicted", "measured")
BALANCE_WHEN = ("before", "after")
RECENT_DURATIONS = 64


def balance_summary(rank_load: npt.ArrayLike) -> dict[str, Any]:
    """Per-layer CV and balancedness of (layers, ranks) load, with the worst layer and the mean of each."""
    load = np.asarray(rank_load, dtype=np.float64)
    cv, bal = imbalance_cv(load), balancedness(load)
    if cv.size == 0:
        return {"cv": [], "balancedness": [], "cv_max": 0.0, "cv_mean": 0.0, "balancedness_min": 1.0,
                "balancedness_mean": 1.0}  # fmt: skip
    return {
        "cv": [float(x) for x in cv],
        "balancedness": [float(x) for x in bal],
        "cv_max": float(cv.max()),
        "cv_mean": float(cv.mean()),
        "balancedness_min": float(bal.min()),
        "balancedness_mean": float(bal.mean()),
    }


@dataclass(slots=True)
class PlacementLog:
    """Rearrangements and requests of one worker since it started (cumulative, like counters)."""

    swaps: int = 0
    """Rearrangements carried out."""
    experts_moved: int = 0
    """Expert replicas copied onto a rank that did not hold them, all layers."""
    duration_buckets: list[int] = field(default_factory=lambda: [0] * (len(SWAP_DURATION_BUCKETS_S) + 1))
    """Rearrangement stalls per ``SWAP_DURATION_BUCKETS_S`` bucket (not cumulative; the last is +Inf).  Only
    measured stalls count: a rearrangement vLLM made itself, or spread over steps (async EPLB), has none."""
    duration_sum_s: float = 0.0
    recent_durations_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_DURATIONS))
    requests: dict[str, int] = field(default_factory=dict)
    """``"<action>/<outcome>"`` -> count (``plan/ok``, ``apply/ok``, ``apply/refused``, ...)."""
    balance: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``"predicted_before"``, ``"predicted_after"``, ``"measured_before"`` (and, from the builder,
    ``"measured_after"``) of the last rearrangement: :func:`balance_summary` dicts."""

    def request(self, action: str, outcome: str) -> None:
        key = f"{action}/{outcome}"
        self.requests[key] = self.requests.get(key, 0) + 1

    def rearranged(
        self, *, duration_s: float | None, experts_moved: int, balance: dict[str, dict[str, Any]]
    ) -> None:
        """One rearrangement; ``duration_s`` None: its stall was not measured."""
        self.swaps += 1
        self.experts_moved += experts_moved
        if duration_s is not None:
            self.duration_buckets[bisect_left(SWAP_DURATION_BUCKETS_S, duration_s)] += 1
            self.duration_sum_s += duration_s
            self.recent_durations_s.append(duration_s)
        self.balance = dict(balance)

    def moved(self, experts: int) -> None:
        """More replicas the last rearrangement copied (the layers it committed later)."""
        self.experts_moved += experts

    def to_json(self, measured_after: dict[str, Any] | None = None) -> dict[str, Any]:
        balance = dict(self.balance)
        if measured_after is not None and self.swaps:
            balance["measured_after"] = measured_after
        return {
            "swaps": self.swaps,
            "experts_moved": self.experts_moved,
            "duration_buckets": list(self.duration_buckets),
            "duration_sum_s": self.duration_sum_s,
            "recent_durations_s": list(self.recent_durations_s),
            "requests": dict(self.requests),
            "balance": balance,
        }


__all__ = ["BALANCE_SOURCES", "BALANCE_WHEN", "PlacementLog", "balance_summary"]
