"""The stack's first measurement: a short profile of its replicas, as ``moeslo profile`` takes one.

Every replica the run may have (as many as the CPUs hold, each pinned as the local actuator
pins it) is swept at once, with Poisson load at rising rates with the run's own prompt and
output lengths (after a warm-up of a few unmeasured requests), until p99 TTFT passes the
objective: in the run, the replicas share the machine with each other and with the load
generator, and one replica measured alone on an idle machine sustained about twice what it
does there.  Then the prefix probe on one replica (ten cold and ten cached-prefix prompts,
one at a time, each stopping at its first token: 0.7-1.3 s at the demo's lengths).  The
fitted :class:`ReplicaProfile` goes into the policy (the controller's capacity model sizes
this machine's replicas from it).  The load is sized from the rate the replicas held within
both objectives, per request (misses judged against chance) and per token gap (half the ITL SLI's
budget: :func:`controller.profile_levels.held_rate_rps`),
and from the capacity model only when no level says, capped by the lightest level that missed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from contracts.errors import UnavailableError
from contracts.slo_defaults import TTFT_THRESHOLD_S
from controller.capacity import ReplicaProfile
from controller.profile_levels import GAP_SHARE, HELD_SHARE, held_rate_rps, lightest_failed_rps
from controller.profiling import fit_profile, prefix_probe_record, profile_point
from harness.engine_limits import assumed_note, profile_limits
from harness.prefix_probe import prefix_probe
from harness.sweep import sweep_rates
from stack.load import demo_length_pairs, demo_lengths, sustainable_rate_rps
from stack.state import StackState

__all__ = ["PROFILE_RATES_RPS", "profile_replicas"]

PROFILE_RATES_RPS = (0.3, 1.0, 2.0, 3.0, 5.0, 8.0)
"""Load levels, lightest first; the sweep stops at the first past twice the TTFT objective (two at least)."""


def _sweep_all(state: StackState, urls: list[str], prompt: float, output: float, vocab_size: int,
               progress: Callable[[str], None]) -> list[list[dict[str, Any]]]:  # fmt: skip
    """The same sweep against every replica at once (a thread each): each replica's level summaries."""
    options = state.options
    pairs = demo_length_pairs(options)  # the run's own lengths: long prompts' prefill chunks stretch decodes

    stop = threading.Event()

    def sweep(index: int) -> list[dict[str, Any]]:
        def say(line: str) -> None:
            if not stop.is_set():  # an interrupted sweep's last level says nothing after the run's last word
                progress(line if len(urls) == 1 else f"replica {index + 1}: {line}")

        return sweep_rates(
            urls[index], PROFILE_RATES_RPS, duration_s=options.profile_s, prompt_tokens=round(prompt),
            output_tokens=max(2, round(output)), vocab_size=vocab_size, model=None,
            seed=options.seed + 1000 * index, ttft_limit_s=2 * TTFT_THRESHOLD_S, progress=say, min_levels=2,
            lengths=pairs, stop=stop,
        )

    pool = ThreadPoolExecutor(max_workers=len(urls))
    try:
        return list(pool.map(sweep, range(len(urls))))
    except BaseException:
        # Ctrl-C: the sweeps stop before their next level and nothing waits for them (``with`` would
        # wait for every level; the caller then stops the replicas, which ends the level under way).
        stop.set()
        raise
    finally:
        pool.shutdown(wait=not stop.is_set(), cancel_futures=True)


def _load_capacity(state: StackState, by_replica: list[list[dict[str, Any]]], profile: ReplicaProfile, *,
                   prompt: float, output: float, lightest: float) -> float:  # fmt: skip
    """The rate per replica the load is sized from: what the replicas held when a level says so.

    The capacity model's ITL line comes from a few medians; near the objective it swung the load
    from 0.2 to 6.8 requests/s between runs.  Without a level that counts, the model decides.
    """
    modelled = sustainable_rate_rps(profile, prompt_tokens=prompt, output_tokens=output)
    held = held_rate_rps(by_replica)
    if held is not None:
        state.event(f"the replicas held {HELD_SHARE:.0%} of their requests within both objectives, and "
                    f"{GAP_SHARE:.1%} of their token gaps within the ITL objective, up to {held:.2f} requests/s "
                    f"each: the load is "
                    f"sized from that (the capacity model says {modelled:.2f})")
        return held
    if modelled < lightest:
        # The model says a replica holds the objectives only below the lightest rate measured (a slow or
        # busy machine): run at that rate rather than at next to nothing, and say what to expect.
        state.event(f"this machine's replica holds the objectives only below {lightest:.2f} requests/s "
                    f"(ITL {profile.itl_base_s * 1000:.1f} ms at light load): the load runs at that rate, "
                    f"and no fleet size here may hold them")
        return lightest
    failed = lightest_failed_rps(by_replica)
    if failed is not None and failed < modelled:
        # The capacity model's line is fitted through medians; a level measured past its misses says more.
        state.event(f"no profile level held {HELD_SHARE:.0%} of its requests and {GAP_SHARE:.1%} of its token gaps "
                    f"within the objectives, the lightest that counted ({failed:.2f} requests/s) missed them: "
                    f"the load is sized from that (the capacity model says {modelled:.2f})")
        return failed
    state.event(f"no profile level held {HELD_SHARE:.0%} of its requests and {GAP_SHARE:.1%} of its token gaps "
                f"within the objectives: the load is sized from the capacity model ({modelled:.2f} requests/s "
                f"a replica)")
    return modelled


def quiet_start_rate(modelled: float, measured: float, *, lightest: float) -> tuple[float, str | None]:
    """The per-replica rate the load's quiet start is a share of, and a line when it is not the model's.

    The capacity model's sustainable rate, unless it rules out even the lightest level measured: on a
    busy or slow machine the fitted ITL line can start above the objective, and the model then gives a
    replica next to nothing, which planned a run without a single request.  The replicas were measured
    serving ``measured``, so the load starts from that.
    """
    if modelled >= lightest:
        return modelled, None
    return measured, (f"the capacity model gives a replica {modelled:.2f} requests/s, below the lightest level "
                      f"measured ({lightest:.2f}): the load starts from the {measured:.2f} the replicas were "
                      f"measured at")


def profile_replicas(state: StackState, urls: list[str], progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure the replicas at ``urls`` under load at once; returns the profile (JSON) and the load's base rate.

    Every replica's levels are points of one profile (the fit takes medians over its light levels),
    so the profile describes a replica while the others are as busy as it is, as in the run.
    """
    from engine.config import ModelConfig

    options = state.options
    checkpoint = options.checkpoint or options.out / "checkpoint"
    _, prompt, output = demo_lengths(options)
    vocab_size = ModelConfig.load(checkpoint).vocab_size
    by_replica = _sweep_all(state, urls, prompt, output, vocab_size, progress)
    summaries = [summary for levels in by_replica for summary in levels]
    if not summaries:
        raise UnavailableError(f"no profile level had a successful request on any of the {len(urls)} replica(s) "
                               f"profiled: nothing to fit a profile or size the load from; see "
                               f"{options.out / 'logs'}")
    probe = prefix_probe_record(prefix_probe(urls[0], prompt_tokens=round(prompt), vocab_size=vocab_size,
                                             model=None, seed=options.seed))  # fmt: skip
    points = [profile_point(stats) for stats in summaries]
    # The replicas' own KV capacity and batch limit, not a guess; the chunk is the one they were started with.
    limits, assumed, engines = profile_limits(urls[0], prefill_chunk_tokens=options.max_num_batched_tokens)
    if assumed:
        state.event(f"the replicas do not export {', '.join(assumed)}: the profile assumes {assumed}")
    profile = fit_profile(
        points, prompt_tokens=round(prompt), name="moeslo-up-replica", prefix_probe=probe, **limits,
        source=f"moeslo up: {len(points)} load levels of {options.profile_s:g} s over {len(urls)} replica(s) "
               f"loaded at once (one pinned CPU each, {options.ep_label}), {round(prompt)}/{max(2, round(output))} "
               f"tokens{assumed_note(assumed)}{engines}",
    )
    lightest = min(p.request_rate_rps for p in points)
    capacity = _load_capacity(state, by_replica, profile, prompt=prompt, output=output, lightest=lightest)
    # The controller sizes a replica for no more than the load is sized from: its latency lines come
    # from medians, and said 1.6-4.5x what the replicas held in six runs (docs/benchmarks.md).
    profile = profile.model_copy(update={"max_request_rate_rps": capacity})
    # The quiet start is base_load of what the controller's own model says a replica sustains (at most
    # what it held): started from the held rate where the model's line is lower, the first tick's load
    # already asked for the second replica, and the forecast had no rise left to scale ahead of.
    sustained, why = quiet_start_rate(sustainable_rate_rps(profile, prompt_tokens=prompt, output_tokens=output),
                                      capacity, lightest=lightest)
    if why:
        state.event(why)
    base = options.base_load * sustained
    state.profile = {"profile": profile.model_dump(mode="json"), "replica_rate_rps": capacity,
                     "base_rate_rps": base}
    state.event(f"profiled {len(urls)} replica(s) loaded at once: the load is sized from {capacity:.2f} requests/s "
                f"a replica (ITL {profile.itl_base_s * 1000:.1f} ms + {profile.itl_per_seq_s * 1000:.2f} ms per "
                f"sequence, "
                f"prefill {profile.prefill_tokens_per_s:.0f} tokens/s, a cached prompt token costing "
                f"{profile.cached_token_cost:.2f} of a computed one); the load starts at {base:.2f} requests/s "
                f"({options.base_load:g} of the {sustained:.2f} "
                f"{'the replicas were measured at' if why else 'the capacity model then gives a replica'})")
    return {"profile": profile.model_dump(mode="json"), "base_rate_rps": base}
