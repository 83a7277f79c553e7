"""A measured ceiling caps a replica only where it was measured: the same objectives, lengths near the sweep's."""

from __future__ import annotations

import pytest

from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
from controller.capacity import DEFAULT_PROFILE, CapacityModel, Load, ReplicaProfile, Targets
from controller.replica_profile import CeilingConditions

SWEPT_AT = CeilingConditions(ttft_s=TTFT_THRESHOLD_S, itl_s=ITL_THRESHOLD_S, prompt_tokens=256, output_tokens=64)
# A slower replica: 15 ms steps + 1.5 ms a sequence, 5k prefill tokens/s; a 20 ms ITL sweep held 1 req/s.
SLOW = ReplicaProfile(name="slow", prefill_tokens_per_s=5000, itl_base_s=0.015, itl_per_seq_s=0.0015,
                      kv_capacity_tokens=100_000, max_num_seqs=64, ttft_overhead_s=0.0)  # fmt: skip


def _load(rate: float, prompt: float, output: float) -> Load:
    return Load(request_rate_rps=rate, prompt_tokens_per_s=rate * prompt, output_tokens_per_s=rate * output)


def test_a_ceiling_measured_at_other_objectives_does_not_cap_a_policy() -> None:
    """Scored at 500 ms / 20 ms, the ceiling sized a 2 s / 100 ms policy's 20 req/s at 20 replicas where 5 do."""
    ceiled = SLOW.model_copy(update={"max_request_rate_rps": 1.0, "ceiling_measured_at": SWEPT_AT})
    loose = Targets(ttft_s=2.0, itl_s=0.1)
    load = _load(20.0, 256, 64)
    assert CapacityModel(ceiled, loose).replicas_needed(load) == CapacityModel(SLOW, loose).replicas_needed(load) < 20
    assert CapacityModel(ceiled).replicas_needed(load) >= 20  # the objectives it was measured at: it caps


@pytest.mark.parametrize(("prompt", "output"), [(32, 16), (32, 64), (256, 16)])
def test_a_ceiling_measured_at_longer_lengths_does_not_cap_shorter_requests(prompt: int, output: int) -> None:
    """In requests/s at 256/64 tokens, the ceiling sized 200 req/s of 32/16-token requests at 10 replicas where 2 do."""
    ceiled = DEFAULT_PROFILE.model_copy(update={"max_request_rate_rps": 20.0, "ceiling_measured_at": SWEPT_AT})
    load = _load(200.0, prompt, output)
    assert CapacityModel(ceiled).replicas_needed(load) == CapacityModel(DEFAULT_PROFILE).replicas_needed(load)
    near = _load(200.0, 256 / 1.4, 64 / 1.4)  # within a factor 1.5 of the sweep's: it caps
    assert CapacityModel(ceiled).replicas_needed(near) >= 10


@pytest.mark.parametrize(("prompt", "output", "ttft_s", "itl_s"), [
    (390, 64, TTFT_THRESHOLD_S, ITL_THRESHOLD_S), (256, 97, TTFT_THRESHOLD_S, ITL_THRESHOLD_S),
    (2048, 512, TTFT_THRESHOLD_S, ITL_THRESHOLD_S), (256, 64, 0.45, ITL_THRESHOLD_S), (256, 64, 0.25, 0.015),
])  # fmt: skip
def test_a_ceiling_caps_heavier_requests_and_stricter_objectives(
    prompt: int, output: int, ttft_s: float, itl_s: float
) -> None:
    """Heavier work holds no more requests/s than the sweep did: dropped there, the ceiling left the fleet to the
    latency lines it corrects, and 40 replicas became 10-14 as the mean length or the objective crossed a bound."""
    ceiled = DEFAULT_PROFILE.model_copy(update={"max_request_rate_rps": 5.0, "ceiling_measured_at": SWEPT_AT})
    model = CapacityModel(ceiled, Targets(ttft_s=ttft_s, itl_s=itl_s))
    assert model.replicas_needed(_load(200.0, prompt, output)) >= 40


def test_a_ceiling_without_its_conditions_caps_every_policy_as_before() -> None:
    """``moeslo up`` and profiles written before the conditions were recorded: the ceiling applies everywhere."""
    ceiled = SLOW.model_copy(update={"max_request_rate_rps": 1.0})
    assert CapacityModel(ceiled, Targets(ttft_s=2.0, itl_s=0.1)).replicas_needed(_load(20.0, 32, 16)) == 20
    unknown_lengths = SWEPT_AT.model_copy(update={"prompt_tokens": None, "output_tokens": None})
    swept = SLOW.model_copy(update={"max_request_rate_rps": 1.0, "ceiling_measured_at": unknown_lengths})
    assert CapacityModel(swept).replicas_needed(_load(20.0, 32, 16)) == 20


def test_a_profile_round_trips_its_ceiling_conditions() -> None:
    ceiled = SLOW.model_copy(update={"max_request_rate_rps": 1.0, "ceiling_measured_at": SWEPT_AT})
    assert ReplicaProfile.model_validate_json(ceiled.to_json()) == ceiled
    assert ReplicaProfile.model_validate_json(SLOW.to_json()).ceiling_measured_at is None
