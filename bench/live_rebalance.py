"""Benchmark, live: rebalancing the embedded engine while its hot experts drift between prompt kinds.

A random checkpoint with ``prompt_kinds=2`` routes prompts from the lower and
upper halves of the vocabulary to different hot experts; the load generator
sends one kind for ``phase_s`` seconds, then the other, and so on.  The
controller's :class:`~controller.actuators.placement.Rebalancer` runs against
the engine's HTTP API as in production (expert-load windows read every tick,
a new history window every phase).

* ``compare``: the same phase schedule twice from the contiguous placement, once
  planning from the last window alone and once from a history of windows; the
  CV each following phase ends with says whether the placement held.
* ``trials``: history planning, rebalanced ``trials`` times (the placement is
  reset to contiguous after each verification); each rebalance's worst-layer CV
  measured over the window after it, against its out-of-sample prediction and
  that window's sampling-noise floor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from contracts.placement import Placement
from controller.actuators.placement import HttpEngineControl, RebalanceEvent, Rebalancer
from controller.policy import ImbalanceObjective, LocalTarget, Mode, Objectives, Policy
from controller.rebalance import TriggerSettings


@dataclass(frozen=True, kw_only=True)
class LiveOptions:
    """The scenario; defaults run in a few minutes on two CPU cores."""

    phase_s: float = 8.0
    """How long the load stays on one prompt kind (the engine's 256-step window is about this long)."""
    phases: int = 7
    """Phases per ``compare`` run."""
    trials: int = 10
    history_windows: int = 4
    ep: int = 4
    slots_per_rank: int = 6
    """16 experts on 4 ranks: 8 spare slots for replicas."""
    seed: int = 5
    router_skew: float = 1.0
    tick_s: float = 0.5
    verify_after_s: float = 4.0
    concurrency: int = 12
    prompt_tokens: int = 24
    max_tokens: int = 4


def make_checkpoint(directory: Path, options: LiveOptions) -> Path:
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    config = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
                         vocab_size=512, max_position_embeddings=512)
    return init_random_checkpoint(directory, config, seed=options.seed, router_skew=options.router_skew,
                                  prompt_kinds=2)


class PhasedLoad:
    """Keeps ``concurrency`` requests in flight, all of the current phase's prompt kind."""

    def __init__(self, url: str, options: LiveOptions, vocab_size: int = 512) -> None:
        self.url, self.options, self.vocab_size = url, options, vocab_size
        self.start_s = time.monotonic()
        self.failures = 0
        self.requests = 0
        self._stop = asyncio.Event()

    def kind(self, now_s: float | None = None) -> int:
        elapsed = (time.monotonic() if now_s is None else now_s) - self.start_s
        return int(elapsed // self.options.phase_s) % 2

    async def run(self) -> None:
        from harness.loadgen import LoadRequest, send_request

        rng = np.random.default_rng(0)
        half = self.vocab_size // 2
        request = LoadRequest(arrival_s=0.0, prompt_tokens=self.options.prompt_tokens,
                              max_tokens=self.options.max_tokens)
        async with httpx.AsyncClient(base_url=self.url, timeout=60.0) as client:

            async def worker() -> None:
                while not self._stop.is_set():
                    low = self.kind() * half
                    prompt = rng.integers(low, low + half, size=self.options.prompt_tokens).tolist()
                    record = await send_request(client, request, prompt, time.monotonic(), None, 0.0)
                    self.requests += 1
                    self.failures += not record.ok

            await asyncio.gather(*(worker() for _ in range(self.options.concurrency)))

    def stop(self) -> None:
        self._stop.set()


def _policy(sustain_s: float, mode: Mode = Mode.ENFORCE) -> Policy:
    """The imbalance SLO of issue 22 (CV <= 0.15); the policy counts ``sustain_s`` in whole seconds."""
    objective = ImbalanceObjective(max_cv=0.15, sustain_s=max(1, round(sustain_s)))
    return Policy(name="live", target=LocalTarget(), mode=mode, objectives=Objectives(imbalance=objective))


def _event_json(event: RebalanceEvent, at_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"at_s": round(at_s, 2), "kind": event.kind, "outcome": event.outcome}
    if event.decision is not None:
        out.update(prediction=event.decision.prediction, predicted_cv_before=event.decision.predicted_cv_before,
                   predicted_cv_after=event.decision.predicted_cv_after)
    if event.plan is not None:
        out["windows"] = event.plan.get("windows")
        out["moves"] = event.plan.get("moves")
    if event.verify is not None:
        out.update(verify=event.verify.reason, measured_cv=event.verify.measured_cv,
                   predicted_cv=event.verify.predicted_cv, noise_cv=event.verify.noise_cv)
    return out


async def _from_contiguous(url: str) -> tuple[HttpEngineControl, Placement]:
    """A control for the engine at ``url``, whose placement is reset to the contiguous one (returned)."""
    control = HttpEngineControl()
    snap = await control.expert_load(url)
    current = snap.placement
    contiguous = Placement.contiguous(current.num_layers, snap.expert_tokens.shape[1], current.num_ranks,
                                      current.slots_per_rank)
    await control.apply_placement(url, contiguous)
    return control, contiguous


async def compare_run(url: str, options: LiveOptions, history_windows: int) -> dict[str, Any]:
    """One pass of the phase schedule from the contiguous placement; phase-end CVs and every event."""
    control, _ = await _from_contiguous(url)
    rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=10 * options.phase_s),
                            verify_after_s=options.verify_after_s, min_window_steps=8,
                            history_windows=history_windows, window_every_s=options.phase_s)
    load = PhasedLoad(url, options)
    driver = asyncio.create_task(load.run())
    events: list[dict[str, Any]] = []
    phase_end_cv: list[dict[str, Any]] = []
    last_cv, last_phase = 0.0, 0
    while (now := time.monotonic()) - load.start_s < options.phases * options.phase_s:
        phase = int((now - load.start_s) // options.phase_s)
        if phase != last_phase:
            phase_end_cv.append({"phase": last_phase, "kind": last_phase % 2, "cv": last_cv})
            last_phase = phase
        snap = await control.expert_load(url)
        last_cv = max(snap.imbalance_cv)
        # Sustained for two phases, as production's 300 s spans ten 30 s windows: the history has filled.
        for event in await rebalancer.tick(_policy(2 * options.phase_s), [url], now):
            events.append(_event_json(event, now - load.start_s))
        await asyncio.sleep(options.tick_s)
    phase_end_cv.append({"phase": last_phase, "kind": last_phase % 2, "cv": last_cv})
    load.stop()
    await driver
    await control.aclose()
    applied = [e for e in events if e["kind"] == "rebalance" and e["outcome"] == "applied"]
    first = int(applied[0]["at_s"] // options.phase_s) if applied else options.phases
    after = [p for p in phase_end_cv if p["phase"] > first]
    return {
        "history_windows": history_windows, "events": events, "phase_end_cv": phase_end_cv,
        "rebalances": len(applied), "first_rebalance_phase": first if applied else None,
        "phases_after_first_rebalance": len(after),
        "phases_after_with_cv_at_most_0.15": sum(p["cv"] <= 0.15 for p in after),
        "worst_cv_after_first_rebalance": max((p["cv"] for p in after), default=None),
        "requests": load.requests, "failed_requests": load.failures,
    }


async def trials_run(url: str, options: LiveOptions, progress: Callable[[str], None]) -> dict[str, Any]:
    """History planning rebalanced ``trials`` times; each verification judged against its prediction."""
    control, contiguous = await _from_contiguous(url)
    rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=1.0), verify_after_s=options.verify_after_s,
                            min_window_steps=8, history_windows=options.history_windows,
                            window_every_s=options.phase_s)
    load = PhasedLoad(url, options)
    driver = asyncio.create_task(load.run())
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + options.trials * 6 * options.phase_s
    while sum(r["kind"] == "verify" for r in results) < options.trials and time.monotonic() < deadline:
        now = time.monotonic()
        # Two phases in advisory mode first, so that every trial has windows of both kinds to plan from.
        warm = now - load.start_s >= 2 * options.phase_s
        for event in await rebalancer.tick(_policy(2.0, Mode.ENFORCE if warm else Mode.ADVISORY), [url], now):
            if not warm:
                continue
            if event.kind == "verify":
                results.append(_event_json(event, now - load.start_s))
                progress(f"live rebalance trial {sum(r['kind'] == 'verify' for r in results)}/{options.trials}")
                await control.apply_placement(url, contiguous)  # start the next trial from scratch
            elif event.outcome == "applied":
                results.append(_event_json(event, now - load.start_s))
        await asyncio.sleep(options.tick_s)
    load.stop()
    await driver
    await control.aclose()
    return {
        "events": results, **_verify_counts([r["verify"] for r in results if r["kind"] == "verify"]),
        "held_out_predictions": sum(r.get("prediction") == "held_out" for r in results),
        "requests": load.requests, "failed_requests": load.failures,
    }


def _verify_counts(reasons: list[str]) -> dict[str, int]:
    """Verifications by what they found: within the noise of the prediction is ``verified`` or
    ``still_violating`` (as predicted, above the objective); ``undecided`` ones measured nothing to judge by
    (too little traffic, no observations, another placement in force)."""
    undecided = ("insufficient_traffic", "no_observations", "superseded")
    return {
        "verifications": len(reasons),
        "rebalances_verified": reasons.count("verified"),
        "within_noise_of_prediction": sum(r in ("verified", "still_violating") for r in reasons),
        "worse_than_predicted": reasons.count("worse_than_predicted"),
        "undecided": sum(r in undecided for r in reasons),
    }


def run_live(
    workdir: Path, options: LiveOptions | None = None, *, trials: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Start the embedded engine on a drifting-router checkpoint and run both experiments."""
    from engine.server import ServerThread
    from exporters.app import ServeOptions, build_stack
    from harness.processes import free_port

    options = options or LiveOptions()
    checkpoint = make_checkpoint(workdir / "checkpoint", options)
    stack = build_stack(ServeOptions(checkpoint=checkpoint, ep=options.ep, slots_per_rank=options.slots_per_rank,
                                     kv_cache_mb=8, max_num_seqs=16))
    out: dict[str, Any] = {"options": asdict(options)}
    with ServerThread(stack.app, port=free_port()) as server:
        for name, windows in (("last_window", 1), ("history", options.history_windows)):
            progress(f"live rebalance: {name} planning over {options.phases} phases")
            out[name] = asyncio.run(compare_run(server.url, options, windows))
        if trials:
            out["trials"] = asyncio.run(trials_run(server.url, options, progress))
    return out
