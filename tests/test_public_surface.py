"""Every package that names its public surface exports names that exist, once each.

(ruff's RUF022 keeps each ``__all__`` sorted.)
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "contracts", "engine", "exporters", "controller", "generators", "harness", "router", "stack", "cli", "bench",
)  # fmt: skip


def _packages() -> list[str]:
    found = []
    for top in PACKAGES:
        found.append(top)
        for info in pkgutil.walk_packages([str(ROOT / top)], prefix=f"{top}."):
            if info.ispkg and "vllm_plugin" not in info.name:
                found.append(info.name)
    return found


@pytest.mark.parametrize("name", _packages())
def test_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        pytest.skip(f"{name} names no public surface")
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"
