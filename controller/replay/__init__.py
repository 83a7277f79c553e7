"""Trace replay: the fleet simulator that drives the production decision core and its baselines over a trace.

- ``world``: how the true fleet differs from the profile the controllers hold;
- ``fleet`` (per request) and ``fluid`` (per tick): the simulated fleets;
- ``signals``: what the controllers can see (scraped metrics), the one observation builder;
- ``hpa``, ``dynamo``, ``dynamo_predictors``: the baselines' algorithms, ported from their sources;
- ``strategies``: every policy reading what its real counterpart reads; ``settings``: their knobs;
- ``runner``: one setting over one workload; ``scoring``: scores over time windows;
- ``sweep`` and ``frontier``: every knob, Pareto frontiers, values at equal attainment;
- ``report``, ``plots``, ``protocol``: what ``moeslo replay`` writes.

Traces themselves are read by :mod:`contracts.traces` (the load generator and the local stack read them too).
"""

from __future__ import annotations

from controller.replay.frontier import Point, at_attainment, compare_at, pareto
from controller.replay.lengths import NAMED_LENGTHS, resolve_lengths
from controller.replay.settings import SWEEP_GRIDS, Setting, parse_setting
from controller.replay.strategies import BASELINES, STRATEGY_NAMES
from controller.replay.world import World

__all__ = [
    "BASELINES",
    "NAMED_LENGTHS",
    "STRATEGY_NAMES",
    "SWEEP_GRIDS",
    "Point",
    "Setting",
    "World",
    "at_attainment",
    "compare_at",
    "pareto",
    "parse_setting",
    "resolve_lengths",
]
