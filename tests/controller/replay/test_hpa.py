"""The HPA baseline reproduces the Kubernetes algorithm on hand-computed cases (15 s syncs from t0 = 0)."""

from __future__ import annotations

import pytest

from controller.replay.hpa import (
    DEFAULT_BEHAVIOR,
    HorizontalPodAutoscaler,
    external_per_pod_replicas,
    milli,
    pods_average_value_replicas,
)


def run(hpa: HorizontalPodAutoscaler, current: int, raw: int, syncs: int) -> list[tuple[float, int]]:
    """Sync every 15 s with the same proposal, applying each result; (time, replicas) after each."""
    out = []
    for i in range(syncs):
        now = 15.0 * i
        current = hpa.sync(now, spec_replicas=current, proposals=[raw])
        out.append((now, current))
    return out


def test_legacy_path_seeds_the_history_with_the_current_count() -> None:
    # KEDA's HPA (behavior nil): the seed (11 at t0) is kept while t0 >= now - 300, so the drop to 2
    # comes at t0 + 315, not at t0 + 15 as an unseeded history would have it.
    hpa = HorizontalPodAutoscaler(max_replicas=100, behavior=None)
    history = dict(run(hpa, current=11, raw=2, syncs=23))
    assert history[0.0] == 11
    assert history[300.0] == 11
    assert history[315.0] == 2


def test_behavior_path_drops_when_the_seed_leaves_the_window() -> None:
    # Behavior path: the seed at t0 is excluded at t0 + 300 (t0 > t0 is false).
    hpa = HorizontalPodAutoscaler(max_replicas=100, behavior=DEFAULT_BEHAVIOR)
    history = dict(run(hpa, current=11, raw=2, syncs=21))
    assert history[285.0] == 11
    assert history[300.0] == 2


def test_tolerance_band_is_inclusive() -> None:
    target = milli(10.0)
    # [10, 11, 12, 11] -> 44000 // 4 = 11000 -> ratio 1.1: within -> keep 4.
    assert pods_average_value_replicas([10000, 11000, 12000, 11000], missing=0, unready=0, target_milli=target,
                                       current=4) == 4  # fmt: skip
    # [12, 12, 12, 12] -> ratio 1.2 -> ceil(4.8) = 5.
    assert pods_average_value_replicas([12000] * 4, missing=0, unready=0, target_milli=target, current=4) == 5


def test_missing_pods_count_as_idle_on_the_way_up_and_at_target_on_the_way_down() -> None:
    target = milli(10.0)
    # Scale-up [14, 14, 14] + 1 missing: 42000 // 4 = 10500 -> 1.05 within -> 4 (ready-only would give 5).
    assert pods_average_value_replicas([14000] * 3, missing=1, unready=0, target_milli=target, current=4) == 4
    # Scale-down [5, 5, 5] + 1 missing at target: 25000 // 4 = 6250 -> ceil(2.5) = 3 (ready-only: 2).
    assert pods_average_value_replicas([5000] * 3, missing=1, unready=0, target_milli=target, current=4) == 3
    assert pods_average_value_replicas([], missing=4, unready=0, target_milli=target, current=4) is None


def test_unready_pods_count_as_idle_only_on_a_scale_up() -> None:
    target = milli(10.0)
    # [20, 20] + 2 pending: ratio 2 > 1 -> pending count 0 -> 40000 // 4 = 10000 -> 1.0 within -> keep 4.
    assert pods_average_value_replicas([20000] * 2, missing=0, unready=2, target_milli=target, current=4) == 4
    # [5, 5] + 2 pending: ratio 0.5 -> pending ignored -> ceil(0.5 * 2) = 1.
    assert pods_average_value_replicas([5000] * 2, missing=0, unready=2, target_milli=target, current=4) == 1


@pytest.mark.parametrize(
    ("behavior", "expected"),
    [(DEFAULT_BEHAVIOR, [7, 14, 20]), (None, [6, 12, 20])],
    ids=["behavior: max(3 + 4, ceil(3 x 2)), then per 15 s", "legacy: max(2 x current, 4)"],
)
def test_scale_up_rate_limits(behavior: object, expected: list[int]) -> None:
    hpa = HorizontalPodAutoscaler(max_replicas=100, behavior=behavior)  # type: ignore[arg-type]
    assert [r for _, r in run(hpa, current=3, raw=20, syncs=3)] == expected


def test_keda_external_average_value() -> None:
    # sum waiting 37, threshold 5, 4 pods: ratio 1.85 -> ceil(37 / 5) = 8; 21 waiting: 1.05 -> keep 4.
    assert external_per_pod_replicas(37000, target_average_milli=5000, status_replicas=4) == 8
    assert external_per_pod_replicas(21000, target_average_milli=5000, status_replicas=4) == 4


def test_invalid_metric_never_scales_down() -> None:
    hpa = HorizontalPodAutoscaler(max_replicas=100, behavior=None)
    assert hpa.sync(0.0, spec_replicas=5, proposals=[None]) == 5
    assert hpa.sync(15.0, spec_replicas=5, proposals=[2, None]) == 5  # some invalid and the rest would go down
    assert hpa.sync(30.0, spec_replicas=5, proposals=[8, None]) == 8


def test_bounds_come_before_the_metrics() -> None:
    hpa = HorizontalPodAutoscaler(min_replicas=2, max_replicas=6, behavior=None)
    assert hpa.sync(0.0, spec_replicas=9, proposals=[None]) == 6
    assert hpa.sync(15.0, spec_replicas=1, proposals=[None]) == 2


@pytest.mark.parametrize(("window_s", "drop_at"), [(0.0, 0.0), (60.0, 60.0), (300.0, 300.0)])
def test_the_hpa_baselines_scale_down_window_is_its_knob(window_s: float, drop_at: float) -> None:
    from controller.replay.settings import SWEEP_GRIDS, Setting
    from controller.replay.strategies import HpaLoadStrategy

    setting = Setting.of("hpa", {"scale_down_window_s": window_s})
    strategy = HpaLoadStrategy(target=0.7, prefill_tokens_per_s_at_slo=1.0, decode_tokens_per_s_at_slo=1.0,
                               max_replicas=100, scale_down_window_s=setting.number("scale_down_window_s"))  # fmt: skip
    history = run(strategy.hpa, current=11, raw=2, syncs=21)
    assert min(t for t, replicas in history if replicas == 2) == drop_at
    assert {knobs["scale_down_window_s"] for knobs in SWEEP_GRIDS["hpa"]} == {0.0, 300.0}
