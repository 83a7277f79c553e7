"""Reading cumulative histograms as Prometheus does: shared by the SLI sources and the capacity model."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["histogram_quantile"]


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative bucket counts keyed by upper edge.

    Linear interpolation inside the bucket that holds the rank; the lowest
    bucket starts at 0; a rank in the +Inf bucket yields the highest finite
    edge.  None when there are no observations.
    """
    if not buckets or not 0 <= q <= 1:
        return None
    edges = sorted(buckets)
    if not math.isinf(edges[-1]):
        return None
    total = buckets[edges[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_edge, lower_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if math.isinf(edge):
                return edges[-2] if len(edges) > 1 else None
            if count == lower_count:
                return edge
            return lower_edge + (edge - lower_edge) * (rank - lower_count) / (count - lower_count)
        lower_edge, lower_count = edge, count
    return edges[-2] if len(edges) > 1 else None
