"""Child processes that end with their parent: Linux's ``PR_SET_PDEATHSIG``, asked for between fork and exec
(:func:`child_setup`) or by the child itself once started (:func:`die_with_parent`: the engine core, its EP ranks).

The harness (every process ``moeslo up`` starts) and the local actuator (the controller's replicas) start
children in sessions of their own, so a Ctrl-C in the terminal does not reach them; without a parent-death
signal a parent killed with SIGKILL (or by the OOM killer) left them running for nobody.  Both stop such a
session's whole group, until :func:`group_runs` finds no live member.  The standard library only (``ctypes``,
``os``, ``signal``), as befits the bottom layer.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Collection

PR_SET_PDEATHSIG = 1

DEFAULT_SHUTDOWN_TIMEOUT_S = 5
"""Seconds ``moeslo serve`` lets its requests in flight finish after SIGTERM (``--shutdown-timeout``, as vLLM's)
before it stops its engine core; whoever stops a replica waits longer than this before stopping the rest of it."""


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up here and not between fork and exec; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def child_setup(cpus: Collection[int] = (), *, die_with_parent: bool = True) -> Callable[[], None] | None:
    """What a child runs between fork and exec (``Popen``'s ``preexec_fn``); None when there is nothing to do.

    With ``die_with_parent`` the kernel sends the child SIGTERM when its parent dies (Linux only; nothing
    elsewhere), the signal surviving the child's ``exec`` (``nice`` and the like exec the real program).
    The kernel sends it when the *thread* that forked the child exits: call this, and start the child, on a
    thread that lasts as long as the parent (its main thread, or its event loop's).  A parent that died before
    the ``prctl`` (the child then has another parent) is answered by exiting at once.  ``cpus`` pins the
    child, and every process it starts, to those CPUs.
    """
    parent = os.getpid()
    pinned = frozenset(cpus)
    prctl = _PRCTL if die_with_parent else None
    if prctl is None and not pinned:
        return None

    def setup() -> None:
        if prctl is not None:
            _death_signal(prctl, signal.SIGTERM)
            if os.getppid() != parent:
                os._exit(1)
        if pinned:
            os.sched_setaffinity(0, pinned)

    return setup


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent goes away (nothing elsewhere).

    Linux sends it when the parent *thread* that started this process exits, so call it only in a
    process started from its parent's main thread.
    """
    if _PRCTL is not None:
        _death_signal(_PRCTL, sig)


def _death_signal(prctl: Callable[..., int], sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs.  A zombie does not: an orphan's new parent (PID 1 in a
    container) may never reap it, and no signal ends it, though signal 0 still reaches it."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True  # no process table to read: signal 0 reached someone
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as stat:
                line = stat.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so read after its last ")".
        state, _ppid, pgrp = line[line.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


__all__ = ["DEFAULT_SHUTDOWN_TIMEOUT_S", "PR_SET_PDEATHSIG", "child_setup", "die_with_parent", "group_runs"]
