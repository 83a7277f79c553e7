"""glibc's allocator, set for the processes that run this planner.

The rebalancer's refine rounds (:mod:`controller.rebalance.robust`) allocate score
matrices of a few megabytes and free them again, round after round, smaller as rows
converge.  Under glibc's defaults (blocks above a threshold that follows the largest
block freed are mapped from the kernel, and the heap's free top is returned once it
exceeds twice that) they were page-faulted in anew: about 10,700 faults (42 MB) per
plan at DeepSeek-V3's size, a quarter of the plan's CPU time.  Serving blocks up to
32 MiB from the heap, and keeping up to 64 MiB free at the heap's top per malloc arena
instead of returning it, removes them; the live rebalancer plans on one thread, so one
arena keeps that memory.

A process-wide setting, so the command line applies it, not the planner: ``moeslo
controller serve``, ``moeslo rebalance`` and ``moeslo bench rebalance`` (whose baseline
planner runs in the same process, under the same settings).  The user's own thresholds, when
set (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or their ``GLIBC_TUNABLES``), win.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "keep_freed_memory"]

MMAP_THRESHOLD_BYTES = 32 << 20
"""Blocks below this come from the heap, not from a fresh mapping (glibc's dynamic threshold tops out here too)."""
TRIM_THRESHOLD_BYTES = 64 << 20
"""Free heap kept before any is returned to the kernel."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def keep_freed_memory() -> bool:
    """Apply the thresholds to this process; False where nothing was changed (not glibc, or the user set them)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _USER_SETTINGS)
            or any(name in tunables for name in _USER_TUNABLES)):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
