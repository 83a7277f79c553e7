"""The policy page's good ratios from Prometheus's bucket series."""

from __future__ import annotations

from controller.api.page.prom import _good_ratio


def test_bucket_edges_spelt_two_ways_are_summed_into_one() -> None:
    """Two exporters behind one model: vLLM writes le="1.0", another le="1"; both are the 1 s edge."""
    good = [({"le": "1"}, [(0.0, 30.0)]), ({"le": "1.0"}, [(0.0, 60.0)]), ({"le": "+Inf"}, [(0.0, 100.0)])]
    total = [({}, [(0.0, 100.0)])]
    assert _good_ratio(good, total, 1.0) == [(0.0, 0.9)]
