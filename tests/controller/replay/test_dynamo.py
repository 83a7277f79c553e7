"""The Dynamo baseline: its timing, correction factors, profile interpolation and predictors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.capacity import DEFAULT_PROFILE
from controller.replay.dynamo import DecodeProfile, DynamoPlanner, PlannerSettings, PrefillProfile
from controller.replay.dynamo_predictors import ArimaPredictor, ConstantPredictor, KalmanPredictor
from controller.replay.signals import FrontendWindow

PROFILE = DEFAULT_PROFILE


def window(requests: float = 1800.0, *, ttft_s: float, itl_s: float, isl: float = 1000.0, osl: float = 200.0,
           duration_s: float = 4.0) -> FrontendWindow:  # fmt: skip
    return FrontendWindow(
        requests=requests, ttft_mean_s=ttft_s, itl_mean_s=itl_s, duration_mean_s=duration_s,
        prompt_mean_tokens=isl, output_mean_tokens=osl,
    )  # fmt: skip


def planner(**settings: object) -> DynamoPlanner:
    return DynamoPlanner(PROFILE, PlannerSettings(predictor="constant", **settings))  # type: ignore[arg-type]


def test_first_decision_waits_one_interval() -> None:
    p = planner()
    obs = window(ttft_s=0.06, itl_s=0.01)
    decisions = {t: p.tick(t, obs, ready_workers=4, deployment_ready=True) for t in np.arange(15.0, 376.0, 15.0)}
    assert [t for t, d in decisions.items() if d is not None] == [180.0, 360.0]


def test_a_decision_made_while_replicas_start_is_dropped() -> None:
    p = planner()
    assert p.tick(180.0, window(ttft_s=0.06, itl_s=0.01), ready_workers=3, deployment_ready=False) is None
    assert p.decisions[-1].dropped and p.decisions[-1].replicas is not None


def test_prefill_correction_only_lowers_prefill_demand() -> None:
    isl = 1000.0
    expected_ttft_s = PrefillProfile(PROFILE, max_context_tokens=32_768).interpolate_ttft_ms(isl) / 1000.0
    fast, slow = planner(), planner()
    fast.tick(180.0, window(ttft_s=0.5 * expected_ttft_s, itl_s=0.001, osl=1.0), ready_workers=4, deployment_ready=True)
    slow.tick(180.0, window(ttft_s=2.0 * expected_ttft_s, itl_s=0.001, osl=1.0), ready_workers=4, deployment_ready=True)
    assert fast.corrections.prefill == pytest.approx(0.5, rel=1e-6)
    assert slow.corrections.prefill == pytest.approx(2.0, rel=1e-6)
    # Prefill demand: 1800 requests x 1000 tokens / 180 s = 10,000 tokens/s, times min(1, p_cf).
    thpt = fast.prefill.interpolate_thpt_per_gpu(isl)
    decode_share = 1800.0 * 1.0 / 180.0 / fast.decode.find_best_throughput_per_gpu(20.0 / fast.corrections.decode, isl)
    assert fast.plan() == math.ceil(10_000.0 * 0.5 / thpt + decode_share)
    assert slow.plan() == math.ceil(10_000.0 / thpt + 1800.0 / 180.0 / slow.decode.find_best_throughput_per_gpu(
        20.0 / slow.corrections.decode, isl))  # fmt: skip


def test_decode_correction_tightens_the_itl_target() -> None:
    decode = DecodeProfile(PROFILE, max_context_tokens=32_768)
    # 18,000 requests of 4 s over 180 s on 40 workers: 10 concurrent each (Little's law).
    concurrency, context = 18_000.0 / 40 * 4.0 / 180.0, 1000.0 + 200.0 / 2
    expected_itl_s = decode.interpolate_itl_ms(concurrency, context) / 1000.0
    observed = window(18_000.0, ttft_s=0.06, itl_s=1.5 * expected_itl_s)
    p = planner()
    p.tick(180.0, observed, ready_workers=40, deployment_ready=True)
    assert p.corrections.decode == pytest.approx(1.5, rel=1e-6)
    tighter = decode.find_best_throughput_per_gpu(20.0 / 1.5, context)
    assert tighter < decode.find_best_throughput_per_gpu(20.0, context)
    unchanged = planner(no_correction=True)
    unchanged.tick(180.0, observed, ready_workers=40, deployment_ready=True)
    assert p.plan() > unchanged.plan()


def test_decode_profile_finds_the_highest_load_within_the_itl_target() -> None:
    decode = DecodeProfile(PROFILE, max_context_tokens=32_768)
    per_gpu = decode.find_best_throughput_per_gpu(20.0, 1260.0)
    # ITL 20 ms at ~65 running sequences: ~3,250 output tokens/s (up to the grid's resolution).
    assert 2_800 < per_gpu < 3_300


def test_no_traffic_skips_the_interval() -> None:
    p = planner()
    empty = FrontendWindow(requests=0.0, ttft_mean_s=None, itl_mean_s=None, duration_mean_s=None,
                           prompt_mean_tokens=None, output_mean_tokens=None)  # fmt: skip
    assert p.tick(180.0, empty, ready_workers=2, deployment_ready=True) is None
    assert p.tick(200.0, window(ttft_s=0.06, itl_s=0.01), ready_workers=2, deployment_ready=True) is None
    assert p.tick(360.0, window(ttft_s=0.06, itl_s=0.01), ready_workers=2, deployment_ready=True) is not None


def test_predictors_skip_leading_zeros_and_treat_nan_as_zero() -> None:
    c = ConstantPredictor()
    for v in (0.0, 0.0, 5.0, math.nan):
        c.add_data_point(v)
    assert c.data == [5.0, 0.0]


def test_arima_is_the_last_value_until_five_points_then_fits_once() -> None:
    a = ArimaPredictor()
    for v in (10.0, 12.0, 11.0, 13.0):
        a.add_data_point(v)
        assert a.predict_next() == v
    a.add_data_point(12.0)
    assert a.predict_next() >= 0.0
    assert a.order is not None
    order = a.order
    for v in (14.0, 13.0, 15.0):
        a.add_data_point(v)
        a.predict_next()
    assert a.order == order  # never re-selected


def test_arima_of_a_constant_series_is_that_value() -> None:
    a = ArimaPredictor()
    for _ in range(8):
        a.add_data_point(7.0)
    assert a.predict_next() == 7.0


def test_kalman_follows_a_linear_trend() -> None:
    k = KalmanPredictor()
    for t in range(40):
        k.add_data_point(100.0 + 10.0 * t)
    assert k.predict_next() == pytest.approx(100.0 + 10.0 * 40, rel=0.01)
