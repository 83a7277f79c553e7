"""The perturbed world differs from the controllers' profile by exactly the stated amounts."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import ValidationError
from controller.capacity import DEFAULT_PROFILE, CapacityModel, Targets
from controller.replay.world import DAY_S, ProfileCache, World, heavier_tail, length_tail_stats, startup_times


@pytest.mark.parametrize("error", [-0.2, 0.2])
def test_capacity_error_scales_throughput(error: float) -> None:
    world = World(capacity_error=error)
    true = ProfileCache(DEFAULT_PROFILE, world, Targets()).profile_at(0.0)
    factor = 1 + error
    assert true.prefill_tokens_per_s == pytest.approx(DEFAULT_PROFILE.prefill_tokens_per_s * factor)
    assert true.step_s(40) == pytest.approx(DEFAULT_PROFILE.step_s(40) / factor)
    assert true.kv_capacity_tokens == DEFAULT_PROFILE.kv_capacity_tokens  # memory is not speed
    nominal_rates = CapacityModel(DEFAULT_PROFILE).sustainable_rates(mean_prompt_tokens=1000, mean_output_tokens=200)
    true_rates = CapacityModel(true).sustainable_rates(mean_prompt_tokens=1000, mean_output_tokens=200)
    # Prefill at the TTFT target and decode at the ITL target both move with the capacity (not exactly
    # linearly: the fixed per-request overhead and the KV limit do not scale).
    assert (true_rates[0] > nominal_rates[0]) == (error > 0)
    assert (true_rates[1] > nominal_rates[1]) == (error > 0)


def test_drift_is_linear_per_day() -> None:
    world = World(capacity_error=-0.2, drift_per_day=-0.05)
    assert world.capacity_factor(0.0) == pytest.approx(0.8)
    assert world.capacity_factor(DAY_S) == pytest.approx(0.8 * 0.95)
    assert world.capacity_factor(3 * DAY_S) == pytest.approx(0.8 * 0.85)
    cache = ProfileCache(DEFAULT_PROFILE, world, Targets())
    assert cache.profile_at(2 * DAY_S).prefill_tokens_per_s == pytest.approx(24_000 * 0.8 * 0.9, rel=1e-3)


def test_heavier_tail_multiplies_the_excess_over_the_quantile() -> None:
    prompts = np.arange(1, 1001, dtype=np.int64)
    threshold = float(np.quantile(prompts, 0.9))
    heavy = heavier_tail(prompts, factor=2.0, quantile=0.9)
    below = prompts <= threshold
    np.testing.assert_array_equal(heavy[below], prompts[below])
    np.testing.assert_allclose(heavy[~below], np.round(threshold + 2.0 * (prompts[~below] - threshold)))
    cv2, p99 = length_tail_stats(heavy)
    assert cv2 > length_tail_stats(prompts)[0] and p99 > length_tail_stats(prompts)[1]


def test_startup_jitter_stays_in_its_band() -> None:
    world = World(startup_s=300.0, startup_jitter=0.2, seed=3)
    times = startup_times(world, world.startup_draws(), 500)
    assert min(times) >= 240.0 and max(times) <= 360.0
    assert startup_times(World(startup_s=300.0), world.startup_draws(), 3) == [300.0] * 3


def test_world_validation_lists_every_problem() -> None:
    with pytest.raises(ValidationError) as info:
        World(capacity_error=-2.0, prompt_tail_factor=0.5)
    assert len(info.value.problems) == 2


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("startup_s", float("inf"), "startup_s must be a finite number >= 0, got inf"),
        ("startup_s", float("nan"), "startup_s must be a finite number >= 0, got nan"),
        ("prompt_tail_factor", float("nan"), "prompt_tail_factor must be in [1, 100], got nan"),
        ("prompt_tail_factor", 1e300, "prompt_tail_factor must be in [1, 100], got 1e+300"),
    ],
)
def test_a_world_of_infinite_or_undefined_numbers_is_refused(field: str, value: float, says: str) -> None:
    """An infinite start-up overflowed the lead time in ticks; a NaN or astronomic tail replayed as if none."""
    with pytest.raises(ValidationError) as info:
        World(**{field: value})
    assert info.value.problems == (says,)


def test_a_measured_rate_ceiling_scales_with_the_worlds_speed() -> None:
    from controller.replay.world import scaled_profile

    measured = DEFAULT_PROFILE.model_copy(update={"max_request_rate_rps": 2.0})
    assert scaled_profile(measured, 0.8).max_request_rate_rps == pytest.approx(1.6)
    assert scaled_profile(measured, 2.0).max_request_rate_rps == pytest.approx(4.0)
    assert scaled_profile(DEFAULT_PROFILE, 0.8).max_request_rate_rps is None
