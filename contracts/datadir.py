"""Where the shared data lives (traces, expert-load files): the one lookup every package uses."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "MOESLO_DATA_DIR"


def default_data_dir() -> Path:
    """``$MOESLO_DATA_DIR``, else ``../shared/data`` beside the repository."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


__all__ = ["DATA_DIR_ENV", "default_data_dir"]
