"""The bottom layer: what engine, exporters, controller and the rest share, importing none of them.

- :mod:`contracts.errors`: the one error hierarchy (``MoesloError`` and its typed subclasses);
- :mod:`contracts.placement`: which logical expert each physical slot holds;
- :mod:`contracts.imbalance`: CV, balancedness and max/mean of per-rank expert load;
- :mod:`contracts.catalogue`: metric names, label names, histogram bucket edges;
- :mod:`contracts.slo_defaults`: the mission's numbers (500 ms TTFT, 20 ms ITL, CV 0.15, ...);
- :mod:`contracts.attainment`: whether one request met the latency objectives;
- :mod:`contracts.traces`: the request-trace formats (Azure, Mooncake, BurstGPT, counts), read once;
- :mod:`contracts.text_files`: a named text file read, or one ``DataError`` line naming it (bytes not UTF-8, bad YAML);
- :mod:`contracts.datadir`: where the shared data folder is;
- :mod:`contracts.lifetime`: child processes that end with their parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "attainment", "catalogue", "datadir", "errors", "imbalance", "lifetime", "placement", "slo_defaults", "text_files",
    "traces",
]


def __getattr__(name: str) -> ModuleType:
    # Submodules load on first use: ``from contracts.errors import ...`` must not pull in numpy.
    if name in __all__:
        return importlib.import_module(f"contracts.{name}")
    raise AttributeError(f"module 'contracts' has no attribute {name!r}")
