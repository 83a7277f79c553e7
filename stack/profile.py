"""The stack's first measurement: a short profile of the first replica, as ``moeslo profile`` takes one.

Poisson load at rising rates with the demo's mean prompt and output lengths (after a
warm-up of a few unmeasured requests), until p99 TTFT passes the objective, then the
prefix probe (ten cold and ten cached-prefix prompts, one at a time, each stopping at
its first token: 0.7-1.3 s at the demo's lengths on a busy two-core machine, so it stays
in the start-up);
the fitted :class:`ReplicaProfile` goes into the
policy (the controller's capacity model sizes this machine's replicas from it), and
the load is sized from what it says one replica sustains within the objectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts.slo_defaults import TTFT_THRESHOLD_S
from controller.profiling import fit_profile, prefix_probe_record, profile_point
from harness.prefix_probe import prefix_probe
from harness.sweep import sweep_rates
from stack.load import demo_lengths, sustainable_rate_rps
from stack.state import StackState

__all__ = ["PROFILE_RATES_RPS", "profile_first_replica"]

PROFILE_RATES_RPS = (0.3, 1.0, 3.0, 8.0)
"""Load levels, lightest first; the sweep stops at the first past twice the TTFT objective (two at least)."""


def profile_first_replica(state: StackState, url: str, progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure the replica at ``url``; returns the profile (JSON) and the load's base rate."""
    from engine.config import ModelConfig

    options = state.options
    checkpoint = options.checkpoint or options.out / "checkpoint"
    _, prompt, output = demo_lengths(options)
    vocab_size = ModelConfig.load(checkpoint).vocab_size
    summaries = sweep_rates(
        url, PROFILE_RATES_RPS, duration_s=options.profile_s, prompt_tokens=round(prompt),
        output_tokens=max(2, round(output)), vocab_size=vocab_size, model=None,
        seed=options.seed, ttft_limit_s=2 * TTFT_THRESHOLD_S, progress=progress, min_levels=2,
    )
    probe = prefix_probe_record(prefix_probe(url, prompt_tokens=round(prompt), vocab_size=vocab_size, model=None,
                                             seed=options.seed))
    points = [profile_point(stats) for stats in summaries]
    profile = fit_profile(
        points, prompt_tokens=round(prompt), kv_capacity_tokens=100_000, max_num_seqs=64, prefill_chunk_tokens=512,
        name="moeslo-up-replica", prefix_probe=probe,
        source=f"moeslo up: {len(points)} load levels of {options.profile_s:g} s against {url} "
               f"(one pinned CPU, EP {options.ep}), {round(prompt)}/{max(2, round(output))} tokens",
    )
    capacity = sustainable_rate_rps(profile, prompt_tokens=prompt, output_tokens=output)
    if capacity <= 0:
        # Even a lone request misses an objective here (a slow or busy machine): run at the lightest
        # measured rate, and say that no fleet size can hold the objectives on this machine.
        capacity = points[0].request_rate_rps
        state.event(f"this machine's replica misses the ITL objective even at light load "
                    f"(ITL {profile.itl_base_s * 1000:.1f} ms at {capacity:.2f} requests/s): no fleet size holds it")
    base = options.base_load * capacity
    state.profile = {"profile": profile.model_dump(mode="json"), "replica_rate_rps": capacity,
                     "base_rate_rps": base}
    state.event(f"profiled the first replica: {capacity:.2f} requests/s within the objectives "
                f"(ITL {profile.itl_base_s * 1000:.1f} ms + {profile.itl_per_seq_s * 1000:.2f} ms per sequence, "
                f"prefill {profile.prefill_tokens_per_s:.0f} tokens/s, a cached prompt token costing "
                f"{profile.cached_token_cost:.2f} of a computed one); the load starts at {base:.2f} requests/s")
    return {"profile": profile.model_dump(mode="json"), "base_rate_rps": base}
