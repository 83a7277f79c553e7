"""The vLLM routes report no balance where nothing was routed: a restarted window's zeros are not perfect balance,
and a rearrangement not yet measured shows no figure of an earlier one."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from engine.vllm_plugin import ExpertLoadSnapshot
from engine.vllm_plugin.placement_log import PlacementLog, balance_summary
from exporters.vllm_metrics import MultiprocessSink, snapshot_families
from exporters.vllm_placement import PlacementMetrics, placement_families

BASE = {"model_name": "m", "engine": "0"}


def _snapshot(window: list[list[float]], placement: dict[str, object] | None = None) -> ExpertLoadSnapshot:
    return ExpertLoadSnapshot(
        model_name="m", engine="0", layer_ids=(0, 1), expert_tokens_total=np.array([[9, 1], [5, 5]], dtype=np.int64),
        rank_tokens_total=np.array([14.0, 6.0]), window_rank_tokens=np.array(window), rank_source="virtual",
        placement=placement,
    )  # fmt: skip


def _samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}  # type: ignore[attr-defined]


def _get(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({**BASE, **labels}.items()))))


def _nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def test_the_snapshot_route_reports_nan_for_a_layer_with_nothing_routed_in_its_window() -> None:
    """Its zeros read as a perfectly balanced layer; absent, it would raise the metrics-absent ticket."""
    samples = _samples(snapshot_families([_snapshot([[9.0, 1.0], [0.0, 0.0]])]))
    assert _get(samples, "moe_layer_imbalance_cv", layer="0") == pytest.approx(0.8)
    assert _nan(_get(samples, "moe_layer_imbalance_cv", layer="1"))
    assert _get(samples, "moe_balancedness_across_layers", stat="max") == _get(
        samples, "moe_layer_balancedness", layer="0"
    )  # over the routed layer alone
    nothing = _samples(snapshot_families([_snapshot([[0.0, 0.0], [0.0, 0.0]])]))
    assert _nan(_get(nothing, "moe_imbalance_cv_across_layers", stat="max"))
    assert _get(nothing, "moe_rank_tokens_total", rank="0") == 14.0  # the counters go on


def test_the_multiprocess_route_sets_nan_where_nothing_was_routed() -> None:
    registry = CollectorRegistry()
    sink = MultiprocessSink(registry)
    sink.publish(_snapshot([[9.0, 1.0], [5.0, 5.0]]))
    sink.publish(_snapshot([[0.0, 0.0], [0.0, 0.0]]))  # the window restarted at a rearrangement
    samples = _samples(registry.collect())
    assert all(_nan(_get(samples, "moe_layer_imbalance_cv", layer=layer)) for layer in ("0", "1"))
    assert _nan(_get(samples, "moe_imbalance_cv_across_layers", stat="max"))


def test_the_multiprocess_route_shows_no_figure_of_an_earlier_rearrangement() -> None:
    log = PlacementLog()
    log.rearranged(duration_s=0.2, experts_moved=4, balance={
        "predicted_before": balance_summary([[90, 10]]), "predicted_after": balance_summary([[50, 50]]),
        "measured_before": balance_summary([[90, 10]])})  # fmt: skip
    registry = CollectorRegistry()
    metrics = PlacementMetrics(registry)
    metrics.publish(_snapshot([[1.0, 1.0], [1.0, 1.0]], log.to_json(measured_after=balance_summary([[55, 45]]))))
    # vLLM's own periodic rearrangement: measured before only, nothing routed on the new map yet.
    log.rearranged(duration_s=None, experts_moved=2, balance={"measured_before": balance_summary([[70, 30]])})
    latest = _snapshot([[1.0, 1.0], [1.0, 1.0]], log.to_json(measured_after=None))
    metrics.publish(latest)
    multiprocess = {k: v for k, v in _samples(registry.collect()).items() if k[0] == "moe_placement_imbalance_cv"}
    snapshot_route = {k: v for k, v in _samples(placement_families([latest])).items()
                      if k[0] == "moe_placement_imbalance_cv"}  # fmt: skip
    assert {k for k, v in multiprocess.items() if not math.isnan(v)} == set(snapshot_route)
    assert all(multiprocess[k] == v for k, v in snapshot_route.items())
