"""The world the simulated fleet lives in, which the controllers do not know.

Every controller in a replay holds the *nominal* :class:`ReplicaProfile` (what
``moeslo profile`` measured once, or the documented default) and the nominal
prompt-length tail of :class:`controller.capacity.Targets`.  The simulated fleet
serves with the *true* world, which may differ from it:

- ``capacity_error``: true throughput is ``(1 + capacity_error)`` times the
  profile's: prefill tokens/s scaled by it, decode step times divided by it
  (a slower GPU, another kernel version, a different tensor-parallel layout);
- ``drift_per_day``: the true capacity factor moves linearly by this fraction per
  simulated day (thermal throttling, a growing share of long contexts, a noisy
  neighbour): ``factor(t) = (1 + capacity_error) * (1 + drift_per_day * t / 1 day)``;
- ``prompt_tail_factor``: prompts longer than the ``tail_quantile`` of the trace get
  their excess over it multiplied by this factor (heavier tail, higher mean);
- ``startup_s`` and ``startup_jitter``: each new replica serves after
  ``startup_s * U(1 - jitter, 1 + jitter)`` (image pull, weight load, warm-up);
  the controllers are told ``startup_s`` as their lead time.

KV-cache capacity and the sequence limit are memory, not speed: they stay the
profile's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from contracts.errors import ValidationError
from contracts.traces import IntArray, LengthDistribution, RequestTrace
from controller.capacity import CapacityModel, ReplicaProfile, Targets

__all__ = [
    "DAY_S",
    "ProfileCache",
    "World",
    "heavier_tail",
    "length_tail_stats",
    "scaled_profile",
]

DAY_S = 86_400.0
_FACTOR_STEP = 0.001
"""Drifting capacity is quantized to this step, so profiles and capacity models are cached."""
_MIN_FACTOR = 0.05
_MAX_TAIL_FACTOR = 100.0
"""The heaviest prompt tail a world may have: excess tokens a hundred times longer (more overflows nothing
yet means nothing)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class World:
    """How the true fleet differs from the profile the controllers hold (all zero: it does not)."""

    capacity_error: float = 0.0
    """True capacity over the profile's, minus one (-0.2: the fleet is 20 % slower than profiled)."""
    drift_per_day: float = 0.0
    """Relative change of the true capacity per simulated day (linear)."""
    prompt_tail_factor: float = 1.0
    """Prompt tokens beyond the ``tail_quantile`` are multiplied by this (1: the trace's own tail)."""
    tail_quantile: float = 0.9
    startup_s: float = 120.0
    """Nominal replica start-up (order to serving); also every controller's lead time."""
    startup_jitter: float = 0.0
    """Each replica's start-up is ``startup_s`` times a uniform draw in ``[1 - j, 1 + j]``."""
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not -0.9 <= self.capacity_error <= 10:
            problems.append(f"capacity_error must be in [-0.9, 10], got {self.capacity_error}")
        if not -1 < self.drift_per_day < 10:
            problems.append(f"drift_per_day must be in (-1, 10), got {self.drift_per_day}")
        if not 1 <= self.prompt_tail_factor <= _MAX_TAIL_FACTOR:
            problems.append(f"prompt_tail_factor must be in [1, {_MAX_TAIL_FACTOR:g}], got {self.prompt_tail_factor}")
        if not 0 < self.tail_quantile < 1:
            problems.append(f"tail_quantile must be in (0, 1), got {self.tail_quantile}")
        if not 0 <= self.startup_s < math.inf:
            problems.append(f"startup_s must be a finite number >= 0, got {self.startup_s}")
        if not 0 <= self.startup_jitter < 1:
            problems.append(f"startup_jitter must be in [0, 1), got {self.startup_jitter}")
        if problems:
            raise ValidationError(problems)

    def capacity_factor(self, t_s: float) -> float:
        """True capacity over the profile's at simulated time ``t_s``."""
        factor = (1.0 + self.capacity_error) * (1.0 + self.drift_per_day * t_s / DAY_S)
        return max(factor, _MIN_FACTOR)

    @property
    def perturbs_tail(self) -> bool:
        return self.prompt_tail_factor != 1.0

    def startup_draws(self) -> np.random.Generator:
        """The random stream of replica start-up times (its own, so policies see the same draws in order)."""
        return np.random.default_rng([self.seed, 0x5747])

    def describe(self) -> dict[str, float]:
        return {
            "capacity_error": self.capacity_error,
            "drift_per_day": self.drift_per_day,
            "prompt_tail_factor": self.prompt_tail_factor,
            "tail_quantile": self.tail_quantile,
            "startup_s": self.startup_s,
            "startup_jitter": self.startup_jitter,
        }


def scaled_profile(profile: ReplicaProfile, factor: float) -> ReplicaProfile:
    """``profile`` with ``factor`` times its throughput: faster prefill, shorter decode steps."""
    if factor == 1.0:
        return profile
    return profile.model_copy(
        update={
            "name": f"{profile.name} x{factor:.3f}",
            "prefill_tokens_per_s": profile.prefill_tokens_per_s * factor,
            "itl_base_s": profile.itl_base_s / factor,
            "itl_per_seq_s": profile.itl_per_seq_s / factor,
            "ttft_overhead_s": profile.ttft_overhead_s,
            # A measured rate ceiling is a speed too: a faster world holds more requests a replica.
            "max_request_rate_rps": None if profile.max_request_rate_rps is None
            else profile.max_request_rate_rps * factor,
            "points": (),
        }
    )


def heavier_tail(prompts: IntArray, *, factor: float, quantile: float) -> IntArray:
    """Prompts whose excess over their ``quantile`` is ``factor`` times longer (the rest unchanged)."""
    if factor == 1.0 or len(prompts) == 0:
        return prompts
    threshold = float(np.quantile(prompts, quantile))
    excess = np.maximum(prompts - threshold, 0.0)
    longer: IntArray = np.round(prompts + (factor - 1.0) * excess).astype(np.int64)
    return longer


def length_tail_stats(prompts: IntArray) -> tuple[float, float]:
    """(squared coefficient of variation, p99 over mean) of prompt lengths: the model's tail inputs."""
    values = np.asarray(prompts, dtype=np.float64)
    mean = float(values.mean()) if len(values) else 0.0
    if mean <= 0:
        return 0.0, 1.0
    return float(values.var()) / mean**2, float(np.quantile(values, 0.99)) / mean


def perturb_trace(trace: RequestTrace, world: World) -> RequestTrace:
    """The trace as the true world sends it (heavier prompt tail)."""
    if not world.perturbs_tail:
        return trace
    prompts = heavier_tail(trace.prompt_tokens, factor=world.prompt_tail_factor, quantile=world.tail_quantile)
    return RequestTrace(
        f"{trace.source} tail x{world.prompt_tail_factor:g}",
        trace.arrival_s,
        prompts,
        trace.output_tokens,
        trace.start_epoch_s,
        trace.prefix_blocks,
    )


def perturb_lengths(lengths: LengthDistribution, world: World) -> LengthDistribution:
    if not world.perturbs_tail:
        return lengths
    prompts = heavier_tail(lengths.prompt_tokens, factor=world.prompt_tail_factor, quantile=world.tail_quantile)
    return LengthDistribution(f"{lengths.name} tail x{world.prompt_tail_factor:g}", prompts, lengths.output_tokens)


def true_targets(nominal: Targets, prompts: IntArray | None) -> Targets:
    """The nominal targets with the true prompt-length tail (when the true prompts are known)."""
    if prompts is None or len(prompts) == 0:
        return nominal
    cv2, p99_over_mean = length_tail_stats(prompts)
    return Targets(
        ttft_s=nominal.ttft_s,
        itl_s=nominal.itl_s,
        headroom=nominal.headroom,
        prompt_cv2=cv2,
        prompt_p99_over_mean=p99_over_mean,
        ttft_allowance=nominal.ttft_allowance,
    )


class ProfileCache:
    """The true profile and capacity model at a time, cached by quantized capacity factor."""

    def __init__(self, nominal: ReplicaProfile, world: World, targets: Targets, prefix_hit_rate: float = 0.0) -> None:
        self.nominal = nominal
        self.world = world
        self.targets = targets
        self.prefix_hit_rate = prefix_hit_rate
        """The fleet's prefix-cache hit rate the true models assume (the oracle's knowledge)."""
        self._models: dict[int, CapacityModel] = {}

    def model_at(self, t_s: float) -> CapacityModel:
        key = round(self.world.capacity_factor(t_s) / _FACTOR_STEP)
        model = self._models.get(key)
        if model is None:
            model = CapacityModel(scaled_profile(self.nominal, key * _FACTOR_STEP), self.targets)
            model.prefix_hit_rate = self.prefix_hit_rate
            self._models[key] = model
        return model

    def profile_at(self, t_s: float) -> ReplicaProfile:
        return self.model_at(t_s).profile


def startup_times(world: World, rng: np.random.Generator, count: int) -> list[float]:
    """Start-up times of ``count`` new replicas."""
    if world.startup_jitter == 0 or count <= 0:
        return [world.startup_s] * max(count, 0)
    draws = rng.uniform(1.0 - world.startup_jitter, 1.0 + world.startup_jitter, count)
    return [float(world.startup_s * d) for d in draws if math.isfinite(d)]
