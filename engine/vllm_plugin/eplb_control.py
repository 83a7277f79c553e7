"""Rebalance on request, the worker side: a method vLLM's ``collective_rpc`` calls on every worker.

The plugin adds ``moeslo_eplb(payload)`` to vLLM's ``WorkerWrapperBase``
(:func:`install_worker_method`); the API server's endpoint calls it on all
workers of the engine at once, between two steps (vLLM sends RPCs down the
same queue as its steps, so every EP rank sees them at the same point).
:class:`EplbControl` answers (see :mod:`engine.vllm_plugin.eplb_requests`):

* ``status``: EPLB's state, rank 0's current placement, this worker's
  routing window (workers that count, i.e. the first TP rank of each engine);
* ``plan`` (dry run): the plan of vLLM's EPLB policy (``EplbState.policy``,
  moeslo's planner when ``MOESLO_VLLM_EPLB_POLICY=1``) or the caller's, for
  the load sent, with its predicted balance; nothing moves.  With EPLB off
  it plans against vLLM's static EP layout (or the plugin's virtual EP):
  what EPLB would gain;
* ``apply``: EPLB's real ``rearrange()`` with that plan (a one-shot policy
  hands vLLM the plan), timed on each rank (the step stall); async EPLB (vLLM
  0.32's default) commits it over the next steps, and the reply says
  ``pending``; with ``"when": "next_window"`` vLLM rearranges after one fresh
  window with its own policy.  Refused (``EplbRefusedError``) with EPLB off,
  under data parallelism (engines get RPCs at different steps, and EPLB's
  collectives would hang), and while async EPLB still commits an earlier
  rearrangement (``eplb_busy``).

Both ``plan`` and ``apply`` are refused under pipeline parallelism: each
stage runs some layers and plans its own, and the request's load (every
layer) is not split among the stages yet.

vLLM's objects are duck-typed and vLLM is imported lazily (:class:`VllmEnv`),
so tests drive this with vLLM's real ``EplbState`` or with stand-ins.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from contracts.errors import MoesloError, ValidationError
from engine.vllm_plugin.eplb_requests import (
    EplbRefusedError,
    FloatArray,
    IntArray,
    check_plan,
    error_json,
    plan_figures,
)
from engine.vllm_plugin.placement_log import balance_summary
from engine.vllm_plugin.ranks import placement_rank_weights, rank_loads
from engine.vllm_plugin.snapshot import Rearrangement
from engine.vllm_plugin.worker import Flusher, WindowView

logger = logging.getLogger("moeslo.vllm_plugin")

WORKER_METHOD = "moeslo_eplb"
"""The name ``collective_rpc`` calls on every worker."""


class VllmEnv:
    """What the trigger asks of vLLM itself (imported lazily; tests pass their own)."""

    def default_policy(self) -> Any:
        from vllm.distributed.eplb.policy import EPLB_POLICIES

        return EPLB_POLICIES["default"]

    def node_count(self, num_ranks: int) -> int:
        from vllm.distributed.parallel_state import get_node_count

        nodes = int(get_node_count())
        return nodes if nodes >= 1 and num_ranks % nodes == 0 else 1  # EplbState.rearrange's fallback

    def ep_rank(self) -> int:
        try:
            from vllm.distributed.parallel_state import get_ep_group

            return int(get_ep_group().rank_in_group)
        except (ImportError, AssertionError, AttributeError):
            return 0


def find_eplb_state(runner: Any) -> Any | None:
    """The model runner's ``EplbState`` (V1 runner: ``eplb_state``; V2: ``eplb.state``), None when EPLB is off."""
    state = getattr(runner, "eplb_state", None)
    if state is None:
        state = getattr(getattr(runner, "eplb", None), "state", None)
    if state is None or not getattr(state, "model_states", None):
        return None
    return state


@dataclass(frozen=True, slots=True, eq=False)
class CurrentPlacement:
    phy2log: IntArray
    num_ranks: int
    num_experts: int
    num_groups: int
    source: str
    """``eplb`` (EPLB's live map), or the static layout the gauges use (``ep``, ``virtual``)."""


def static_placement(window: WindowView) -> CurrentPlacement | None:
    """vLLM's EP layout (or the plugin's virtual EP) as a placement; None when ranks hold unequal expert counts."""
    weights = window.rank_weights
    if weights.ndim == 2:
        weights = np.broadcast_to(weights, (len(window.layer_ids), *weights.shape))
    _, num_experts, num_ranks = weights.shape
    held = weights > 0
    per_rank = held.sum(axis=1)
    if not (per_rank == per_rank[0, 0]).all():
        return None
    # Slots rank-major, experts in id order within a rank.
    order = np.argsort(np.argmax(held, axis=2), axis=1, kind="stable")
    return CurrentPlacement(np.asarray(order, dtype=np.int64), num_ranks, num_experts, 1, window.rank_source)


INTEGER_LOAD_TOTAL = 1_000_000
"""Tokens a layer of fractional load is scaled to before vLLM's integer EPLB inputs see it."""


def integer_load(load: FloatArray) -> IntArray:
    """``load`` as the integer token counts vLLM's EPLB takes: counts as they are; shares (fractions) scaled
    per layer to ``INTEGER_LOAD_TOTAL`` first, so rounding keeps their shape (a plan per layer does not
    depend on its load's scale; rounded as given, shares summing to 1 became all zeros)."""
    if np.array_equal(load, np.rint(load)):
        return load.astype(np.int64)
    totals = load.sum(axis=1, keepdims=True)
    scaled = np.divide(load * INTEGER_LOAD_TOTAL, totals, out=np.zeros_like(load), where=totals > 0)
    rounded: IntArray = np.rint(scaled).astype(np.int64)
    return rounded


class EplbControl:
    """Answers the trigger's requests in one worker process."""

    def __init__(self, flusher: Callable[[], Flusher | None] = lambda: None, env: VllmEnv | None = None) -> None:
        self._flusher = flusher
        """The plugin's flusher in this worker (None where this worker does not count)."""
        self.env = env or VllmEnv()

    def handle(self, runner: Any, payload: str | dict[str, Any]) -> dict[str, Any]:
        """One request (a JSON string from the API server, or a dict); errors come back as ``{"error": ...}``."""
        action = "unknown"
        try:
            request = json.loads(payload) if isinstance(payload, str) else dict(payload)
            action = str(request.get("action"))
            if action == "status":
                return self.status(runner)
            if action == "plan" and find_eplb_state(runner) is None and self._flusher() is None:
                # EPLB off and this worker does not count (a TP rank > 0): the counting worker answers.
                return {"skipped": "EPLB is off and this worker does not count"}
            if action == "plan":
                reply = self.plan(runner, request)[0]
                self._count(action, "ok")
                return reply
            if action == "apply":
                reply = self.apply(runner, request)
                self._count(action, "ok")
                return reply
            raise ValidationError(f"unknown action {action!r} (status, plan, apply)")
        except (MoesloError, json.JSONDecodeError) as exc:
            self._count(action, "refused" if isinstance(exc, EplbRefusedError) else "invalid")
            return {"error": error_json(exc)}
        except Exception as exc:  # reported to the caller; the worker must keep serving
            logger.exception("moeslo: EPLB request %s failed", action)
            self._count(action, "failed")
            return {"error": error_json(exc)}

    def _count(self, action: str, outcome: str) -> None:
        flusher = self._flusher()
        if flusher is not None and action in ("plan", "apply"):
            flusher.request(action, outcome)

    # ---- status -----------------------------------------------------------
    def status(self, runner: Any) -> dict[str, Any]:
        state = find_eplb_state(runner)
        flusher = self._flusher()
        window = flusher.window() if flusher is not None else None
        current = self.current(state, window)
        policy = state.policy if state is not None else self._safe_default_policy()
        out: dict[str, Any] = {
            "eplb": None if state is None else eplb_info(state),
            "policy": None if policy is None else policy.__name__,
            "num_ranks": None if current is None else current.num_ranks,
            "phy2log": None,
            "placement_source": None if current is None else current.source,
            "window": None,
            "placement_log": None,
        }
        if current is not None and (state is None or self.env.ep_rank() == 0):
            out["phy2log"] = current.phy2log.tolist()
        if window is not None:
            out["window"] = {"layer_ids": list(window.layer_ids), "expert_tokens": window.expert_tokens.tolist(),
                             "expert_tokens_total": window.expert_tokens_total.tolist(),
                             "active_flushes": window.active_flushes, "rank_source": window.rank_source}  # fmt: skip
            log = flusher.builder.placement_log if flusher is not None else None
            out["placement_log"] = None if log is None else log.to_json()
        return out

    def _safe_default_policy(self) -> Any | None:
        try:
            return self.env.default_policy()
        except ImportError:
            return None

    def current(self, state: Any | None, window: WindowView | None) -> CurrentPlacement | None:
        if state is not None:
            model_state = next(iter(state.model_states.values()))
            model = model_state.model
            return CurrentPlacement(
                np.asarray(model_state.physical_to_logical_map.cpu().numpy(), dtype=np.int64),
                int(model.num_physical_experts // model.num_local_physical_experts),
                int(model.num_logical_experts), int(model.num_expert_groups), "eplb",
            )  # fmt: skip
        return None if window is None else static_placement(window)

    # ---- plan (dry run) -----------------------------------------------------
    def plan(self, runner: Any, request: dict[str, Any]) -> tuple[dict[str, Any], IntArray, FloatArray]:
        """The plan for the request's load and its predicted figures: (reply, phy2log, load)."""
        parallel = getattr(runner, "parallel_config", None)
        if int(getattr(parallel, "pipeline_parallel_size", 1) or 1) > 1:
            raise EplbRefusedError("eplb_pipeline_parallel", "pipeline stages each run some MoE layers, and "
                                   "the load and plan of every layer are not split among them: not supported yet")
        state = find_eplb_state(runner)
        flusher = self._flusher()
        window = flusher.window() if flusher is not None else None
        current = self.current(state, window)
        if current is None:
            raise EplbRefusedError("no_placement", "EPLB is off and the plugin does not count here (or vLLM's EP "
                                   "layout gives ranks unequal expert counts): no placement to plan from")  # fmt: skip
        if request.get("load") is None:
            raise EplbRefusedError("no_window", "no load to plan for: send 'load' or enable the plugin's counting "
                                   "(MOESLO_VLLM_PLUGIN=1)")  # fmt: skip
        load = np.asarray(request["load"], dtype=np.float64)
        if load.shape != (current.phy2log.shape[0], current.num_experts):
            raise ValidationError(f"load is {load.shape[0]} x {load.shape[1]}, vLLM runs {current.phy2log.shape[0]} "
                                  f"MoE layers x {current.num_experts} experts")  # fmt: skip
        policy = state.policy if state is not None else self.env.default_policy()
        started = time.perf_counter()
        if request.get("placement") is not None:
            ranks = request.get("placement_ranks")
            if ranks is not None and ranks != current.num_ranks:
                raise ValidationError(f"placement.num_ranks is {ranks}, vLLM runs {current.num_ranks} EP ranks")
            phy2log = np.asarray(request["placement"], dtype=np.int64)
            source = "request"
        else:
            phy2log = self._policy_plan(policy, load, current, state is not None)
            source = policy.__name__
        plan_s = time.perf_counter() - started
        check_plan(phy2log, current.phy2log.shape, current.num_experts)
        reply: dict[str, Any] = {
            "dry_run": request.get("action") == "plan", "eplb": state is not None, "plan_source": source,
            "placement_source": current.source, "num_ranks": current.num_ranks, "plan_s": plan_s,
            "phy2log": phy2log.tolist(), **plan_figures(load, current.phy2log, phy2log, current.num_ranks),
        }  # fmt: skip
        if window is not None:
            reply["measured_before"] = balance_summary(rank_loads(window.expert_tokens, window.rank_weights))
        return reply, phy2log, load

    def _policy_plan(self, policy: Any, load: FloatArray, current: CurrentPlacement, eplb_on: bool) -> IntArray:
        import torch

        num_replicas = current.phy2log.shape[1]
        nodes = self.env.node_count(current.num_ranks) if eplb_on else 1
        out = policy.rebalance_experts(
            torch.from_numpy(integer_load(load)), num_replicas, current.num_groups, nodes,
            current.num_ranks, torch.from_numpy(current.phy2log.copy()),
        )  # fmt: skip
        return np.asarray(out.cpu().numpy(), dtype=np.int64)

    # ---- apply ------------------------------------------------------------
    def apply(self, runner: Any, request: dict[str, Any]) -> dict[str, Any]:
        state = find_eplb_state(runner)
        if state is None:
            raise EplbRefusedError("eplb_off", "EPLB is off in this vLLM: start it with --enable-expert-parallel "
                                   "--enable-eplb (a dry run works without it)")  # fmt: skip
        parallel = getattr(runner, "parallel_config", None)
        if int(getattr(parallel, "data_parallel_size", 1) or 1) > 1:
            raise EplbRefusedError("eplb_data_parallel", "EP across data-parallel engines: engines get the request at "
                                   "different steps and EPLB's collectives would hang; not supported yet")  # fmt: skip
        if request.get("when") == "next_window":
            return schedule_next_window(state)
        if state.is_async and any(getattr(ms, "rebalanced", False) for ms in state.model_states.values()):
            # vLLM's worker thread would finish the earlier one, then drop ours (its "coordinated stop").
            raise EplbRefusedError("eplb_busy", "vLLM's async EPLB is still committing an earlier rearrangement "
                                   "(one layer per step): ask again once it has")  # fmt: skip
        reply, phy2log, load = self.plan(runner, request)
        reply["dry_run"] = False
        return {**reply, **self._rearrange(state, phy2log, load, reply)}

    def _rearrange(self, state: Any, phy2log: IntArray, load: FloatArray, figures: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``rearrange()`` with the plan.  Synchronous EPLB commits the map within it (``applied``); async
        EPLB (vLLM 0.32's default) only records the load there, and its worker thread plans and the next steps
        commit the map layer by layer: the reply says ``pending``, and the swap is recorded (the window restarts)
        when the plugin sees the map change."""
        import torch

        model_state = next(iter(state.model_states.values()))
        previous_policy = state.policy
        state.policy = one_shot_policy(phy2log, state, previous_policy)
        model_state.last_expert_load = torch.as_tensor(integer_load(load),
                                                       device=model_state.last_expert_load.device)  # fmt: skip
        keys = ("predicted_before", "predicted_after", "measured_before")
        expected = Rearrangement(int(figures["experts_moved"]), {k: figures[k] for k in keys if k in figures},
                                 target=placement_rank_weights(phy2log, int(model_state.model.num_logical_experts),
                                                               int(figures["num_ranks"])))  # fmt: skip
        out: dict[str, Any] = {"async": bool(state.is_async)}

        def run() -> Rearrangement | None:
            started = time.perf_counter()
            try:
                state.rearrange(use_last_expert_load=True)
            finally:
                if not state.is_async:
                    state.policy = previous_policy
            out["stall_s"] = time.perf_counter() - started
            committed = np.asarray(model_state.physical_to_logical_map.cpu().numpy(), dtype=np.int64)
            out["applied"] = bool(np.array_equal(committed, phy2log))
            out["pending"] = bool(state.is_async) and not out["applied"]
            if out["pending"]:
                return replace(expected, pending=True)
            # Synchronous: committed, or vLLM kept its map (ROCm's "no material gain" skip): no swap then.
            return replace(expected, duration_s=out["stall_s"]) if out["applied"] else None

        flusher = self._flusher()
        if flusher is not None:
            flusher.rearrange(run)
        else:
            run()
        # The next periodic rearrangement is a full interval away (every rank runs this same RPC).
        state.expert_rearrangement_step = 0
        state._update_layer_should_record()
        return out


def eplb_info(state: Any) -> dict[str, Any]:
    model = next(iter(state.model_states.values())).model
    return {
        "step": int(state.expert_rearrangement_step),
        "step_interval": int(state.expert_rearrangement_step_interval),
        "window_size": int(state.expert_load_window_size),
        "num_logical_experts": int(model.num_logical_experts),
        "num_physical_experts": int(model.num_physical_experts),
        "num_redundant_experts": int(model.num_redundant_experts),
        "num_expert_groups": int(model.num_expert_groups),
        "async": bool(state.is_async),
        "policy": state.policy.__name__,
    }


def schedule_next_window(state: Any) -> dict[str, Any]:
    """Move EPLB's counter so that vLLM records one fresh window and rearranges at its own step."""
    window = int(state.expert_load_window_size)
    state.expert_rearrangement_step = max(0, int(state.expert_rearrangement_step_interval) - window)
    state._update_layer_should_record()
    return {"dry_run": False, "scheduled": True, "steps_until_rearrangement": window, "stall_s": 0.0}


def one_shot_policy(phy2log: IntArray, state: Any, previous: Any) -> Any:
    """A policy class that answers once with ``phy2log``, then puts ``previous`` back (also on vLLM's async thread)."""
    import torch

    plan = torch.from_numpy(np.ascontiguousarray(phy2log, dtype=np.int64))

    class OneShotPlan(previous):  # type: ignore[misc]  # a subclass: vLLM may use the policy's helpers
        @classmethod
        def rebalance_experts(cls, *args: Any, **kwargs: Any) -> Any:
            state.policy = previous
            return plan.clone()

    return OneShotPlan


def install_worker_method(control: EplbControl) -> bool:
    """Add ``moeslo_eplb`` to vLLM's worker wrapper (what ``collective_rpc`` calls); False without vLLM."""
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except ImportError:
        return False

    def moeslo_eplb(self: Any, payload: str) -> dict[str, Any]:
        return control.handle(getattr(self.worker, "model_runner", None), payload)

    setattr(WorkerWrapperBase, WORKER_METHOD, moeslo_eplb)
    return True


__all__ = [
    "WORKER_METHOD",
    "CurrentPlacement",
    "EplbControl",
    "VllmEnv",
    "eplb_info",
    "find_eplb_state",
    "install_worker_method",
    "one_shot_policy",
    "schedule_next_window",
    "static_placement",
]
