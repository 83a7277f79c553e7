"""What a prefix-cache hit still costs: the capacity model with the profile's ``cached_token_cost``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.capacity import DEFAULT_PROFILE, CapacityModel, Load, PrefixProbe, ReplicaProfile


def load(rate: float, prompt: float = 4000.0, output: float = 100.0) -> Load:
    return Load(request_rate_rps=rate, prompt_tokens_per_s=rate * prompt, output_tokens_per_s=rate * output)


def model(cost: float, hit_rate: float) -> CapacityModel:
    capacity = CapacityModel(DEFAULT_PROFILE.model_copy(update={"cached_token_cost": cost}))
    capacity.prefix_hit_rate = hit_rate
    return capacity


def test_a_free_cached_token_leaves_one_minus_the_hit_rate() -> None:
    assert DEFAULT_PROFILE.cached_token_cost == 0.0
    assert DEFAULT_PROFILE.uncached_share(0.6) == pytest.approx(0.4)
    # As before the cost existed: half the prompt cached doubles the longest feasible prompt.
    assert model(0.0, 0.5).longest_feasible_prompt() == pytest.approx(2 * model(0.0, 0.0).longest_feasible_prompt())


def test_at_full_cost_the_hit_rate_changes_nothing() -> None:
    cold, cached = model(1.0, 0.0), model(1.0, 0.8)
    for rate in (1.0, 20.0, 300.0):
        assert cached.predict(load(rate), 3) == cold.predict(load(rate), 3)
        assert cached.replicas_needed(load(rate)) == cold.replicas_needed(load(rate))
    assert cached.longest_feasible_prompt() == pytest.approx(cold.longest_feasible_prompt())


def test_a_dearer_cached_token_never_needs_fewer_replicas() -> None:
    costs = (0.0, 0.25, 0.5, 0.75, 1.0)
    for rate in (5.0, 40.0, 300.0):
        needed = [model(c, 0.7).replicas_needed(load(rate)) for c in costs]
        assert needed == sorted(needed)
        ttft = [model(c, 0.7).predict(load(rate), needed[-1]).ttft_p99_s for c in costs]
        assert ttft == sorted(ttft) and ttft[0] < ttft[-1]
    limits = [model(c, 0.7).longest_feasible_prompt() for c in costs]
    assert limits == sorted(limits, reverse=True) and limits[0] > limits[-1]
    assert model(0.0, 0.7).replicas_needed(load(300.0)) < model(1.0, 0.7).replicas_needed(load(300.0))


def test_an_old_profile_without_the_cost_loads(tmp_path: Path) -> None:
    document = json.loads(DEFAULT_PROFILE.to_json())
    del document["cached_token_cost"], document["prefix_probe"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    loaded = ReplicaProfile.load(path)
    assert loaded.cached_token_cost == 0.0 and loaded.prefix_probe is None
    assert loaded == DEFAULT_PROFILE


def test_the_cost_is_a_share_and_the_probe_is_recorded() -> None:
    probe = PrefixProbe(cold_ttft_p50_s=0.1, cached_ttft_p50_s=0.04, cached_share=0.75, requests=5)
    profile = DEFAULT_PROFILE.model_copy(update={"cached_token_cost": 0.2, "prefix_probe": probe})
    assert ReplicaProfile.model_validate_json(profile.to_json()) == profile
    with pytest.raises(ValueError, match="cached_token_cost"):
        ReplicaProfile.model_validate({**json.loads(DEFAULT_PROFILE.to_json()), "cached_token_cost": 1.5})
