"""The bottom layer: what engine, exporters, controller and the rest share, importing none of them.

- :mod:`contracts.errors`: the one error hierarchy (``MoesloError`` and its typed subclasses);
- :mod:`contracts.placement`: which logical expert each physical slot holds;
- :mod:`contracts.imbalance`: CV, balancedness and max/mean of per-rank expert load;
- :mod:`contracts.catalogue`: metric names, label names, histogram bucket edges;
- :mod:`contracts.slo_defaults`: the mission's numbers (500 ms TTFT, 20 ms ITL, CV 0.15, ...);
- :mod:`contracts.datadir`: where the shared data folder is.
"""

from __future__ import annotations

from contracts import catalogue, datadir, errors, imbalance, placement, slo_defaults

__all__ = ["catalogue", "datadir", "errors", "imbalance", "placement", "slo_defaults"]
