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
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    from controller.rebalance.allocator import keep_freed_memory
    from controller.rebalance.history import plan_over_windows

    applied = keep_freed_memory() if sys.argv[1] == "on" else False
    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, 257) ** 0.9
    windows = [rng.poisson(2000 * rng.permutation(popularity)[None, :].repeat(58, axis=0)) for _ in range(7)]

    def faults_of_second_plan():
        plan_over_windows(windows, num_ranks=32, slots_per_rank=9)  # the first plan grows the heap
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        plan_over_windows(windows, num_ranks=32, slots_per_rank=9)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    if sys.argv[2] == "thread":  # as the live rebalancer plans: on a worker thread, in its own malloc arena
        with ThreadPoolExecutor(max_workers=1) as pool:
            faults = pool.submit(faults_of_second_plan).result()
    else:
        faults = faults_of_second_plan()
    print(applied, faults)
""")


def _second_plan_faults(setting: str, where: str) -> tuple[bool, int]:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _PLAN_TWICE, setting, where], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_second_plan_page_faults_far_less_with_the_settings(where: str) -> None:
    _, without = _second_plan_faults("off", where)
    if without <= 500:  # e.g. transparent huge pages for every mapping: nothing for the setting to remove
        pytest.skip(f"glibc's defaults faulted only {without} pages in here")
    applied, with_settings = _second_plan_faults("on", where)
    assert applied
    assert with_settings * 10 < without, (with_settings, without)


@pytest.mark.parametrize(("name", "value"), [
    ("MALLOC_TRIM_THRESHOLD_", "1048576"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576"),
])
def test_the_users_own_settings_win(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    assert keep_freed_memory() is False
