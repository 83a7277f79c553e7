"""Request-count series of a trace at a chosen bin width (what the forecasters see)."""

from __future__ import annotations

import numpy as np

from contracts.traces import CountTrace, FloatArray, RequestTrace


def request_counts(trace: RequestTrace | CountTrace, bin_s: float) -> FloatArray:
    """Requests per ``bin_s`` bin.

    Count traces are summed over whole groups of their own bins (``bin_s`` must be a
    multiple of the trace's bin width); their first and last bins are dropped, being
    the half-width bins that rounding to the bin centre leaves at each end.
    """
    if isinstance(trace, RequestTrace):
        counts = trace.counts(bin_s)
        return counts[:-1] if len(counts) > 1 else counts  # the last bin is partial
    ratio = bin_s / trace.bin_s
    group = round(ratio)
    if group < 1 or abs(ratio - group) > 1e-9:
        raise ValueError(f"bin {bin_s:g} s must be a whole multiple of the trace's {trace.bin_s:g} s bins")
    inner = trace.counts[1:-1] if len(trace.counts) > 2 else trace.counts
    usable = len(inner) // group * group
    return np.asarray(inner[:usable].reshape(-1, group).sum(axis=1), dtype=np.float64)
