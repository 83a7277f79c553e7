"""contracts.lifetime: what a child runs between fork and exec so that it ends with its parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contracts.lifetime import child_setup

ORPHANED = ("import os\nfrom contracts.lifetime import child_setup\n"
            "setup = child_setup()\nos.getppid = lambda: 1  # as when the parent died before the prctl\n"
            "setup()\nprint('ran on')\n")


def test_nothing_to_do_without_the_death_signal_or_cpus() -> None:
    assert child_setup(die_with_parent=False) is None
    assert child_setup([0], die_with_parent=False) is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_whose_parent_died_before_the_prctl_exits_at_once() -> None:
    """The kernel sends no signal for a parent already gone: the child must notice and go by itself."""
    done = subprocess.run([sys.executable, "-c", ORPHANED], check=False, capture_output=True, text=True, timeout=30,
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 1
    assert "ran on" not in done.stdout
