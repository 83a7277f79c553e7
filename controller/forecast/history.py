"""A bounded history of one time series at a fixed bin width (memory stays flat)."""

from __future__ import annotations

import math

import numpy as np

from controller.forecast.models import FloatArray

DAY_S = 86_400.0
TWO_WEEKS_S = 14 * DAY_S


def bins_covering(span_s: float, bin_s: float) -> int:
    """Whole bins that cover ``span_s`` (at least one): a lead time the bin does not divide is covered to its end."""
    return max(1, math.ceil(span_s / bin_s - 1e-9))


class RingSeries:
    """The last ``capacity`` values of a series, oldest first when read back.

    Values are appended one per bin; :meth:`values` copies them out in order.  At
    one-minute bins the default two weeks is 20,160 floats (160 KiB).
    """

    def __init__(self, bin_s: float, *, keep_s: float = TWO_WEEKS_S) -> None:
        if bin_s <= 0:
            raise ValueError(f"bin_s must be > 0, got {bin_s}")
        if keep_s < bin_s:
            raise ValueError(f"keep_s ({keep_s}) must cover at least one bin ({bin_s})")
        self.bin_s = float(bin_s)
        self.capacity = int(np.ceil(keep_s / bin_s))
        self._buffer = np.zeros(self.capacity, dtype=np.float64)
        self._count = 0

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    @property
    def total_appended(self) -> int:
        """Values appended since creation (keeps counting after the buffer wraps)."""
        return self._count

    def append(self, value: float) -> None:
        self._buffer[self._count % self.capacity] = value
        self._count += 1

    def extend(self, values: FloatArray) -> None:
        for value in values:
            self.append(float(value))

    def last(self) -> float:
        if self._count == 0:
            raise IndexError("empty series")
        return float(self._buffer[(self._count - 1) % self.capacity])

    def values(self, last_n: int | None = None) -> FloatArray:
        """The stored values in time order (the newest ``last_n`` if given)."""
        n = len(self)
        if last_n is not None:
            n = min(n, last_n)
        end = self._count % self.capacity
        if self._count <= self.capacity:
            return self._buffer[self._count - n : self._count].copy()
        idx = (np.arange(end - n, end)) % self.capacity
        return self._buffer[idx]

    @property
    def span_s(self) -> float:
        return len(self) * self.bin_s
