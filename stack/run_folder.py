"""A ``moeslo up`` run's output folder: owned by one run at a time, cleared of the last run's state.

The folder also holds what the user keeps (a checkpoint, notes): only the files a run writes are
removed, and only from a folder a run marked as its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from contracts.errors import ConflictError

__all__ = ["RUN_LOCK", "RUN_MARKER", "RUN_STATE", "clear_last_run", "lock_run_folder"]


RUN_STATE = ("controller.db", "controller.db-shm", "controller.db-wal", "prometheus", "alertmanager",
             "summary.json", "requests.csv", "moeslo-up.png", "logs")
"""What a run leaves in its output folder that the next run must not inherit: the controller's pending
verifications, Prometheus's series and Alertmanager's record of pages sent (which would silence the next
run's pages for hours); and its results and logs (a run that fails or is interrupted must not leave the
last run's summary looking like its own, nor its replicas' logs appended to the last run's)."""

RUN_MARKER = ".moeslo-up"
"""Written into the output folder by every run: only a folder that has it (or the controller.yaml of a
run from before the marker) is cleared, so ``--out`` pointed at someone else's folder loses nothing."""


RUN_LOCK = ".moeslo-up.lock"
"""Locked (``flock``) by the run using the folder: a second run there would clear the first one's state."""


def lock_run_folder(out: Path) -> int:
    """An exclusive lock on ``out`` for this run (a file descriptor to close when it ends); ConflictError
    when another run holds it.  The kernel drops the lock with the process, so a killed run leaves none."""
    fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ConflictError(f"another `moeslo up` is running with --out {out} (pid {holder}); "
                            f"wait for it to end, or give this run another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def clear_last_run(out: Path) -> bool:
    """Remove the last run's state from ``out`` if a run made it; True when there was some."""
    if not (out / RUN_MARKER).is_file() and not (out / "controller.yaml").is_file():
        return False
    found = False
    for name in RUN_STATE:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            found = True
        elif path.exists() or path.is_symlink():
            path.unlink()  # a link itself, never what it points to
            found = True
    return found
