"""The machine a benchmark ran on, as plain data in its JSON.

Engine ratios depend on the CPU's vector instructions: vLLM's CPU backend recommends AVX-512
and runs a slower path without it, while our engine runs torch's kernels on whatever the CPU
has.  Figures from two machines compare only when their ``isa`` lists match, so the engine
benchmarks record it beside their figures.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
"""The /proc/cpuinfo flags that pick a matrix kernel's path (x86)."""

CPUINFO = Path("/proc/cpuinfo")


def describe_cpu(cpuinfo: str) -> dict[str, Any]:
    """The model name and the kernel-relevant ISA flags of the first processor in a /proc/cpuinfo text."""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if model and flags:
            break
    return {"cpu_model": model or platform.processor() or "unknown", "isa": [f for f in ISA_FLAGS if f in flags]}


def machine() -> dict[str, Any]:
    """This machine: CPU model, ISA flags, logical CPUs and the 1-minute load average now (take it before a
    benchmark starts its own processes)."""
    text = CPUINFO.read_text() if CPUINFO.exists() else ""
    return describe_cpu(text) | {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
