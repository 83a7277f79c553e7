"""Benchmarks as a library: each is a function that takes a progress callback and returns JSON-able figures.

``moeslo bench <name>`` (``cli/bench.py``) calls them; every figure is a ratio against a named
baseline measured in the same run.  Measured results are recorded in ``docs/benchmarks.md``.
"""
