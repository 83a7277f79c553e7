"""What the tick loop keeps in memory about each policy between ticks (the read API shows it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FORECAST_NOT_IN_USE = ("warming_up", "forecast_unreliable", "forecast_disabled")
"""Reasons that say the forecast did not size the fleet this tick."""


@dataclass
class PolicyRuntime:
    """What the tick loop last learnt about one policy (kept in memory, rebuilt on restart)."""

    current_replicas: int | None = None
    desired_replicas: int | None = None
    stale: bool = True
    observed_at: datetime | None = None
    sli: dict[str, float | None] = field(default_factory=dict)
    error_budget_remaining: dict[str, float | None] = field(default_factory=dict)
    burn_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seen: dict[str, Any] = field(default_factory=dict)
    """What the core saw: load, queue, running batch, KV usage, ready replicas, replica budget."""
    forecast: dict[str, Any] | None = None
    """The forecast (``ForecastView`` as JSON) and whether it sized the fleet (``in_use``)."""
    decision: dict[str, Any] | None = None
    """The last decision: action, reasons, detail."""


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """Non-finite floats become None: JSON has no NaN or infinity, and the API must not fail on them."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}


__all__ = ["PolicyRuntime", "json_safe"]
