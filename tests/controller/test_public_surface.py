"""The controller service's packages name their public surface in a sorted ``__all__``."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    "module", ["controller.api", "controller.store", "controller.sources", "controller.actuators"]
)
def test_all_is_sorted_and_resolves(module: str) -> None:
    package = importlib.import_module(module)
    names = package.__all__
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for name in names:
        assert getattr(package, name) is not None, f"{module}.{name}"
