"""``moeslo replay --router``: the entry router's policies on a replayed trace, fleet size held fixed.

Each routing policy is the router's own (:func:`router.policies.policy_named`, the
code ``moeslo route`` runs), fed :class:`~router.types.ReplicaState`\\ s built from
the replay's simulated replicas (:class:`controller.replay.fleet.RequestFleet`):
its prefill backlog as pending prompt tokens at the profile's prefill rate, its
admitted requests as the running batch, its KV tokens in use.  The replay's own
least-loaded dispatch is the baseline ``replay-least-loaded``.

For every fleet size, every policy replays the same trace in the same true world
(no scaling: the fleet is what is compared); the report gives per policy and size
the p99 TTFT and the share within both SLOs, the smallest size reaching the
attainment goal, and the ratios the entry-router issue asks for: p99 TTFT of the
cost policy over round-robin's and over least-loaded's at one size, and the fleet
each needs.

It also gives the *floor*: the same trace with every request sent to a replica that
has nothing else to do (a fleet large enough that one always waits), so each TTFT is
the request's own prefill.  No routing policy on any fleet gets its p99 below that,
except by prefix-cache hits (an idle replica here holds none of the request's blocks):
the floor over round-robin's p99 is the least ratio a router can reach on the trace.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from contracts.slo_defaults import LATENCY_TARGET
from contracts.traces import PREFIX_BLOCK_TOKENS, FloatArray, RequestTrace
from contracts.ttft_objective import FLAT, TtftAllowance
from controller.capacity import ReplicaProfile
from controller.replay.fleet import RequestFleet, RouteHook
from controller.replay.protocol import ReplayRequest
from controller.replay.runner import ReplayContext
from controller.replay.scoring import score
from router.policies import policy_named
from router.prefix_index import PrefixIndex, with_cached_tokens
from router.types import CostModel, ReplicaState, RequestFeatures

BASELINE = "replay-least-loaded"
"""The replay's own dispatch: least prefill backlog plus decode work."""


def router_hook(name: str, trace: RequestTrace, profile: ReplicaProfile, ttft_objective_s: float,
                ttft_allowance: TtftAllowance = FLAT) -> RouteHook:  # fmt: skip
    """The router's policy ``name`` as the replay's routing hook."""
    choose = policy_named(name, CostModel(ttft_objective_s=ttft_objective_s, ttft_allowance=ttft_allowance,
                                          decode_step_s=profile.itl_base_s,
                                          itl_per_seq_s=profile.itl_per_seq_s,
                                          cached_token_cost=profile.cached_token_cost))  # fmt: skip
    turns = itertools.count()
    rate = profile.prefill_tokens_per_s
    kv_capacity = max(float(profile.kv_capacity_tokens), 1.0)
    blocks = trace.prefix_blocks
    # What the router knows of each replica's cache: the blocks it sent there (as `moeslo route` keeps it).
    sent = PrefixIndex(max(1, profile.kv_capacity_tokens // PREFIX_BLOCK_TOKENS))

    def route(i: int, t: float, backlog: FloatArray, decoders: FloatArray, kv_used: FloatArray) -> int:
        states = []
        for j in range(len(backlog)):
            waiting_s = max(float(backlog[j]) - t, 0.0)
            running = int(decoders[j])
            states.append(ReplicaState(
                name=str(j), waiting=int(waiting_s > 0), running=running, kv_usage=float(kv_used[j]) / kv_capacity,
                pending_prefill_tokens=int(waiting_s * rate), outstanding=running, prefill_tokens_per_s=rate,
            ))  # fmt: skip
        prefix = tuple(int(h) for h in blocks[i]) if blocks is not None else ()
        features = RequestFeatures(prompt_tokens=int(trace.prompt_tokens[i]), max_tokens=int(trace.output_tokens[i]),
                                   stream=True, prefix_blocks=prefix, block_tokens=PREFIX_BLOCK_TOKENS)  # fmt: skip
        choice = choose(features, with_cached_tokens(states, features, sent), next(turns))
        chosen = choice.replica if choice.replica is not None else "0"
        sent.record(chosen, prefix)
        return int(chosen)

    return route


IDLE_FLEET_FACTORS = (8, 32, 128)
"""The floor's fleets, as multiples of the largest compared size: the first where every request finds an idle
replica (the report says how many found none on the last one when none does)."""


def idle_hook() -> tuple[RouteHook, list[int]]:
    """A routing hook that sends each request to a replica with no prefill queued and nothing decoding (the
    least loaded when none is), and the count of requests that found none."""
    missed = [0]

    def route(i: int, t: float, backlog: FloatArray, decoders: FloatArray, kv_used: FloatArray) -> int:
        busy = np.maximum(backlog - t, 0.0) + decoders
        choice = int(np.argmin(busy))
        if busy[choice] > 0:
            missed[0] += 1
        return choice

    return route, missed


def _run(ctx: ReplayContext, replicas: int, route: RouteHook | None) -> dict[str, Any]:
    workload, config = ctx.workload, ctx.config
    trace = workload.requests
    assert trace is not None
    fleet = RequestFleet(trace, ctx.truth, initial_replicas=replicas, tick_s=config.tick_s,
                         ttft_target_s=config.targets.ttft_s, itl_target_s=config.targets.itl_s,
                         ttft_allowance=config.targets.ttft_allowance, route=route)  # fmt: skip
    for k in range(workload.ticks):
        now_s = (k + 1) * config.tick_s
        fleet.advance(now_s)
        fleet.sample(now_s)
    scored = score(fleet.outcomes(workload.ticks), config.warmup_s, math.inf)
    arrivals = trace.arrival_s >= config.warmup_s
    ttfts = fleet.ttft_s[arrivals]
    served = np.isfinite(ttfts)
    finite, normalized = ttfts[served], fleet.normalized_ttft_s()[arrivals][served]

    def pct(values: FloatArray, q: float) -> float | None:
        return round(float(np.percentile(values, q)), 4) if values.size else None

    return {
        "replicas": replicas, "attainment_both": round(scored.attainment_both, 5),
        "attainment_ttft": round(scored.attainment_ttft, 5), "attainment_itl": round(scored.attainment_itl, 5),
        "ttft_p50_s": pct(finite, 50), "ttft_p99_s": pct(finite, 99),
        "normalized_ttft_p99_s": pct(normalized, 99), "unserved": int(ttfts.size - finite.size),
    }


def compare_routers(request: ReplayRequest, policies: list[str], sizes: list[int] | None = None,
                    goal: float = LATENCY_TARGET) -> dict[str, Any]:  # fmt: skip
    """Every policy at every fleet size; the smallest size reaching ``goal``; the issue's ratios.  A trace with
    no request after the warm-up is refused before any run (:meth:`ReplayRequest.scored_workload`)."""
    ctx = ReplayContext(request.scored_workload(), request.replica_profile(), request.config())
    trace = ctx.workload.requests
    if trace is None:
        raise ValueError("routing needs every request simulated: use a request trace (--mode request)")
    if sizes is None:
        peak = ctx.peak_need(ctx.config.targets.headroom)
        sizes = [max(1, round(peak * f)) for f in (0.3, 0.4, 0.5, 0.6, 0.8, 1.0)]
    # Ascending, so the first size reaching the goal is the smallest and the last the largest.
    sizes = sorted(set(sizes))

    def hook(name: str) -> RouteHook | None:
        # A fresh hook per run: it holds what the router sent where, which a fresh fleet does not cache.
        return None if name == BASELINE else router_hook(
            name, trace, ctx.profile, ctx.config.targets.ttft_s, ctx.config.targets.ttft_allowance)

    results = {name: [_run(ctx, n, hook(name)) for n in sizes] for name in [BASELINE, *policies]}
    needed = {name: next((r["replicas"] for r in rows if r["attainment_both"] >= goal), None)
              for name, rows in results.items()}  # fmt: skip
    floor = _floor(ctx, max(sizes))
    return {"trace": str(request.trace), "requests": len(trace), "sizes": sizes, "goal_attainment": goal,
            "baseline": BASELINE, "results": results, "replicas_for_goal": needed, "floor": floor,
            "ratios": _ratios(results, needed, sizes, floor)}  # fmt: skip


def _floor(ctx: ReplayContext, largest: int) -> dict[str, Any]:
    """The trace with every request on an idle replica: its own prefill is its TTFT (see the module docstring)."""
    for factor in IDLE_FLEET_FACTORS:
        idle, missed = idle_hook()
        floor = _run(ctx, largest * factor, idle) | {"requests_without_an_idle_replica": missed[0]}
        if not missed[0]:
            break
    return floor


def _ratios(results: dict[str, list[dict[str, Any]]], needed: dict[str, int | None],
            sizes: list[int], floor: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Cost over round-robin and least-loaded: p99 TTFT (as the objective counts it: normalized to the
    long-prompt allowance, which is TTFT itself under a flat objective) on the smallest fleet where the
    cost policy reaches the goal (the largest when it never does), with the floor's p99 over theirs
    there; and the fleets each needs."""
    if "cost" not in results:
        return {}
    out: dict[str, Any] = {}
    for other in ("round-robin", "least-loaded"):
        if other not in results:
            continue
        key = "normalized_ttft_p99_s"
        usable = [k for k in range(len(sizes)) if results["cost"][k][key] and results[other][k][key]]
        at_goal = [k for k in usable if sizes[k] == needed["cost"]]
        if usable:
            k = at_goal[0] if at_goal else usable[-1]
            cost, theirs = results["cost"][k][key], results[other][k][key]
            out[f"ttft_p99_cost_over_{other}"] = {"replicas": sizes[k], "ratio": round(cost / theirs, 3)}
            if floor[key]:
                out[f"ttft_p99_floor_over_{other}"] = {"replicas": sizes[k], "ratio": round(floor[key] / theirs, 3)}
        mine, theirs_needed = needed["cost"], needed[other]
        if mine is not None and theirs_needed is not None:
            out[f"fleet_cost_over_{other}"] = round(mine / theirs_needed, 3)
    return out


__all__ = ["BASELINE", "IDLE_FLEET_FACTORS", "compare_routers", "idle_hook", "router_hook"]
