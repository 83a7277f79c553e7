"""Child processes that end with their parent: the engine core, and the EP ranks the core starts."""

from __future__ import annotations

import contextlib
import ctypes
import signal

__all__ = ["die_with_parent"]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` when the parent goes away (no-op elsewhere).

    Linux sends it when the parent *thread* that started this process exits, so call it only in a
    process started from its parent's main thread.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig))  # PR_SET_PDEATHSIG
