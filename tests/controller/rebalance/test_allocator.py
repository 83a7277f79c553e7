"""The allocator settings the planning commands apply: a plan's score matrices are no longer page-faulted in anew."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from controller.rebalance.allocator import keep_freed_memory

ROOT = Path(__file__).resolve().parents[3]

_PLAN_TWICE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from controller.rebalance.allocator import keep_freed_memory
    from controller.rebalance.history import plan_over_windows

    applied = keep_freed_memory() if sys.argv[1] == "on" else False
    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, 257) ** 0.9
    windows = [rng.poisson(2000 * rng.permutation(popularity)[None, :].repeat(32, axis=0)) for _ in range(4)]
    plan_over_windows(windows, num_ranks=32, slots_per_rank=9)  # the first plan grows the heap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    plan_over_windows(windows, num_ranks=32, slots_per_rank=9)
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _second_plan_faults(setting: str) -> tuple[bool, int]:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _PLAN_TWICE, setting], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_second_plan_page_faults_far_less_with_the_settings() -> None:
    applied, with_settings = _second_plan_faults("on")
    _, without = _second_plan_faults("off")
    assert applied
    assert without > 500, f"the default allocator was expected to fault pages in anew ({without} faults)"
    assert with_settings * 10 < without, (with_settings, without)


def test_the_users_own_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert keep_freed_memory() is False
