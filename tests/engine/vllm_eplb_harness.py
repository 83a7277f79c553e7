"""In-process vLLM EPLB on the CPU: N gloo ranks run vLLM 0.32's real ``EplbState`` behind moeslo's trigger.

Run with the vLLM venv's Python (``tests/engine/test_vllm_eplb.py`` does)::

    .venv-vllm/bin/python tests/engine/vllm_eplb_harness.py --world 2 --out DIR [--eplb off] [--duration-s 240]

Why a harness: vLLM CPU 0.32 cannot run EPLB with two ranks (docs/vllm.md
gives the errors), so this drives everything that *can* run for real:

* vLLM's ``VllmConfig``, ``init_distributed_environment`` and
  ``initialize_model_parallel`` on gloo, and ``EplbState.add_model`` on a
  stand-in MoE model with vLLM's ``MixtureOfExperts`` attributes, whose
  expert weights carry their logical id (so a move is visible in the data);
* our policy registered through the plugin's entry point function and
  chosen by ``add_model``; vLLM's ``step``, ``rearrange``, gloo transfer
  (``rearrange_expert_weights_inplace``) and map commit;
* the plugin's counting (``ExpertLoadCounter``, ``Flusher``, snapshots) on
  rank 0, as the first TP rank counts in vLLM;
* the trigger's worker method (``EplbControl.handle``) on every rank, called
  the way vLLM's executor does: rank 0 takes each request off a queue and
  broadcasts it, every rank answers between two steps, rank 0 gathers;
* the trigger's routes (``EplbEndpoint``) on a real HTTP server on rank 0,
  with ``/metrics`` from the plugin's collector.

Stand-ins: the model (a real Qwen3-MoE cannot run EP on vLLM CPU), the
router's load recording (a no-op on CPU in vLLM 0.32: the harness writes
``expert_load_pass`` as the CUDA kernel would), the engine client (the
queue), and CPU shims vLLM needs: ``torch.Event`` (``rearrange`` times
itself with it), ``torch.accelerator.current_stream`` (the gloo
communicator syncs it), and for async EPLB (``--eplb-async``, vLLM's
default: its worker thread moves the weights, and the steps after commit
the map layer by layer) the stream and device calls of that thread.
``--eplb off`` runs one rank without EPLB (the refusal).  Writes ``port``
once serving and ``result.json`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import queue
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYERS, EXPERTS, REDUNDANT, TOP_K, TOKENS_PER_STEP, HIDDEN = 2, 16, 2, 4, 64, 8
STEP_SLEEP_S = 0.004


def install_cpu_shims() -> None:
    class CpuEvent:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.t = 0.0

        def record(self, stream: Any = None) -> None:
            self.t = time.perf_counter()

        def synchronize(self) -> None:
            return None

        def wait(self, stream: Any = None) -> None:
            return None

        def elapsed_time(self, other: CpuEvent) -> float:
            return (other.t - self.t) * 1000.0

    class NoopStream:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            return None

        def synchronize(self) -> None:
            return None

    torch.Event = CpuEvent  # type: ignore[misc,assignment]
    torch.accelerator.current_stream = lambda *a, **k: NoopStream()  # type: ignore[assignment]
    # Async EPLB's worker thread runs on a stream of the current accelerator.
    torch.Stream = NoopStream  # type: ignore[misc,assignment]
    torch.accelerator.set_stream = lambda *a, **k: None  # type: ignore[assignment]
    torch.accelerator.set_device_index = lambda *a, **k: None  # type: ignore[assignment]
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")  # type: ignore[assignment]


class FakeLayer:
    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.w13, self.w2 = w13, w2

    def get_expert_weights(self) -> list[torch.Tensor]:
        return [self.w13, self.w2]

    def set_eplb_state(self, *args: Any) -> None:
        return None


class FakeMoE:
    """vLLM's ``MixtureOfExperts`` attributes; local slot weights hold their logical expert's id."""

    def __init__(self, rank: int, world: int) -> None:
        self.num_moe_layers = LAYERS
        self.num_expert_groups = 1
        self.num_logical_experts = self.num_routed_experts = EXPERTS
        self.num_redundant_experts = REDUNDANT
        self.num_shared_experts = 0
        self.num_physical_experts = EXPERTS + REDUNDANT
        self.num_local_physical_experts = self.num_physical_experts // world
        first = rank * self.num_local_physical_experts
        ids = torch.tensor([(first + i) % EXPERTS for i in range(self.num_local_physical_experts)], dtype=torch.float32)
        self.moe_layers = [FakeLayer(ids[:, None].repeat(1, HIDDEN).clone(), (10 * ids[:, None]).repeat(1, HIDDEN))
                           for _ in range(LAYERS)]
        self.expert_weights: list[list[torch.Tensor]] = []

    def set_eplb_state(self, *args: Any) -> None:
        self.expert_weights = [list(layer.get_expert_weights()) for layer in self.moe_layers]


def skewed_topk(rng: np.random.Generator) -> list[np.ndarray]:
    """One step's routed expert ids per layer (tokens x top-k), Zipf-skewed, a different hot set per layer."""
    out = []
    for layer in range(LAYERS):
        p = 1.0 / np.arange(1, EXPERTS + 1) ** 1.2
        p = p[np.random.default_rng(layer).permutation(EXPERTS)]
        out.append(rng.choice(EXPERTS, size=(TOKENS_PER_STEP, TOP_K), p=p / p.sum()))
    return out


class Engine:
    """One rank: vLLM's EplbState on the stand-in model, the plugin, the trigger's worker side."""

    def __init__(self, rank: int, world: int, eplb: bool, use_async: bool = False) -> None:
        from controller.rebalance.vllm_policy import register
        from engine.vllm_plugin.eplb_control import EplbControl

        self.rank, self.world = rank, world
        register({"MOESLO_VLLM_EPLB_POLICY": "1"})  # the general plugin's entry point function
        self.model = FakeMoE(rank, world)
        self.state: Any = None
        self.parallel = self._init_vllm(eplb, use_async)
        if eplb:
            from vllm.distributed.eplb.eplb_state import EplbState

            self.state = EplbState(self.parallel, torch.device("cpu"))
            self.state.add_model(self.model, types.SimpleNamespace(model="fake-moe", compute_hash=lambda: "fake"))
            self.model_state = self.state.model_states["fake"]
            if use_async:  # as vLLM's GPU model runner starts it after add_model
                self.state.device_index = 0
                self.state.start_async_loop()
        self.runner = types.SimpleNamespace(eplb_state=self.state, parallel_config=self.parallel)
        self.flusher = self._start_plugin() if rank == 0 else None
        self.control = EplbControl(lambda: self.flusher)
        self.rng = np.random.default_rng(1234)  # the same routing on every rank, as under TP

    def _init_vllm(self, eplb: bool, use_async: bool) -> Any:
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.config.parallel import EPLBConfig, ParallelConfig
        from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

        parallel = ParallelConfig(tensor_parallel_size=self.world, enable_expert_parallel=True,
                                  eplb_config=EPLBConfig(step_interval=100_000, window_size=32, use_async=use_async,
                                                         communicator="torch_gloo"))
        config = VllmConfig(parallel_config=parallel)
        parallel = config.parallel_config
        if eplb:  # after validation: vLLM's config check rejects EPLB on CPU (docs/vllm.md)
            parallel.enable_eplb = True
            parallel.eplb_config.num_redundant_experts = REDUNDANT
        self._config_context = set_current_vllm_config(config)
        self._config_context.__enter__()
        init_distributed_environment(world_size=self.world, rank=self.rank, local_rank=self.rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{os.environ['HARNESS_PORT']}")
        initialize_model_parallel(tensor_model_parallel_size=self.world, backend="gloo")
        return parallel

    def rank_weights(self) -> tuple[np.ndarray, str]:
        from engine.vllm_plugin import contiguous_rank_weights, eplb_rank_weights

        if self.state is None:
            return contiguous_rank_weights(EXPERTS, 2), "virtual"
        l2p = self.model_state.logical_to_physical_map.numpy()
        return np.stack([eplb_rank_weights(l2p[i], EXPERTS + REDUNDANT, self.world) for i in range(LAYERS)]), "eplb"

    def _start_plugin(self) -> Any:
        from engine.vllm_plugin import ExpertLoadCounter, Flusher, SnapshotBuilder

        self.snapshots: list[Any] = []
        self.counter = ExpertLoadCounter(list(range(LAYERS)), EXPERTS)
        builder = SnapshotBuilder(model_name="fake-moe", engine="0", layer_ids=self.counter.layer_ids,
                                  window_flushes=40, rank_weights=self.rank_weights)
        sink = types.SimpleNamespace(publish=self.snapshots.append)
        flusher = Flusher(self.counter, builder, sink, interval_s=0.05)
        flusher.start()
        return flusher

    def step(self) -> None:
        topk = skewed_topk(self.rng)
        if self.counter_on():
            for layer, ids in enumerate(topk):
                self.counter.capture(layer, torch.from_numpy(ids.astype(np.int32)))
        if self.state is not None:
            # What vLLM's CUDA router kernel records (a no-op on CPU): each token's expert load on its replicas.
            p2l = self.model_state.physical_to_logical_map.numpy()
            load = np.zeros(p2l.shape, dtype=np.int64)
            for layer, ids in enumerate(topk):
                counts = np.bincount(ids.ravel(), minlength=EXPERTS)
                replicas = np.bincount(p2l[layer], minlength=EXPERTS)
                load[layer] = counts[p2l[layer]] // replicas[p2l[layer]]
            self.model_state.expert_load_pass.copy_(torch.from_numpy(load))
            self.state.step()

    def counter_on(self) -> bool:
        return self.flusher is not None

    def checks(self) -> dict[str, Any]:
        """Weights carry the map's experts; EPLB's logical-to-physical map agrees with it."""
        if self.state is None:
            return {"rank": self.rank}
        from vllm.distributed.eplb.eplb_state import compute_logical_maps

        p2l = self.model_state.physical_to_logical_map
        local = self.model.num_local_physical_experts
        first = self.rank * local
        weights_ok = all(
            torch.equal(self.model.expert_weights[layer][0][:, 0], p2l[layer, first:first + local].float())
            and torch.equal(self.model.expert_weights[layer][1][:, 0], 10 * p2l[layer, first:first + local].float())
            for layer in range(LAYERS)
        )
        l2p, count = compute_logical_maps(p2l, EXPERTS)
        committed = self.model_state.logical_to_physical_map  # padded with -1 to EPLB's max replicas
        width = l2p.shape[2]
        return {
            "rank": self.rank,
            "policy_class": self.state.policy.__name__,
            "phy2log": p2l.tolist(),
            "weights_match_map": bool(weights_ok),
            "l2p_matches_vllm": bool(torch.equal(committed[..., :width], l2p) and (committed[..., width:] == -1).all()),
            "replica_count_matches_vllm": bool(torch.equal(count, self.model_state.logical_replica_count)),
            "step": int(self.state.expert_rearrangement_step),
        }


class QueueEngineClient:
    """``collective_rpc`` as vLLM's executor does it: requests queue up and run on every rank between steps."""

    def __init__(self) -> None:
        self.pending: queue.Queue[tuple[str, concurrent.futures.Future[list[dict[str, Any]]]]] = queue.Queue()

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = (),
                             kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        future: concurrent.futures.Future[list[dict[str, Any]]] = concurrent.futures.Future()
        self.pending.put((str(args[0]), future))
        return await asyncio.wrap_future(future)


def serve_http(engine: Engine, client: QueueEngineClient, out: Path) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse
    from prometheus_client import CollectorRegistry, generate_latest

    from exporters.vllm_eplb_http import EplbEndpoint, EplbService
    from exporters.vllm_metrics import snapshot_families
    from exporters.vllm_placement import placement_families

    app = FastAPI()
    EplbEndpoint().attach_router(app)
    app.state.moeslo_eplb = EplbService(client)

    class Latest:
        def collect(self) -> list[Any]:
            latest = engine.snapshots[-1:] if engine.flusher is not None else []
            return [*snapshot_families(latest), *placement_families(latest)]

    registry = CollectorRegistry()
    registry.register(Latest())  # type: ignore[arg-type]

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode())

    @app.post("/harness/stop")
    def stop() -> dict[str, bool]:
        (out / "stop").write_text("stop")
        return {"stopping": True}

    config = uvicorn.Config(app, host="127.0.0.1", port=int(os.environ["HARNESS_HTTP_PORT"]), log_level="warning")
    threading.Thread(target=uvicorn.Server(config).run, daemon=True).start()


def next_message(client: QueueEngineClient, out: Path, deadline: float) -> tuple[Any, Any]:
    """Rank 0: the stop signal, a pending request (with its future), or nothing."""
    if (out / "stop").exists() or time.monotonic() > deadline:
        return "stop", None
    try:
        return client.pending.get_nowait()
    except queue.Empty:
        return None, None


def run_rank(rank: int, world: int, eplb: bool, out: Path, duration_s: float, use_async: bool = False) -> None:
    torch.set_num_threads(1)
    install_cpu_shims()
    engine = Engine(rank, world, eplb, use_async)
    client = QueueEngineClient()
    if rank == 0:
        serve_http(engine, client, out)
        (out / "port").write_text(os.environ["HARNESS_HTTP_PORT"])
    deadline = time.monotonic() + duration_s
    steps = 0
    while True:
        # Between two steps: rank 0 hands a pending request (or the stop signal) to every rank.
        message, future = next_message(client, out, deadline) if rank == 0 else (None, None)
        box = [message]
        dist.broadcast_object_list(box, src=0)
        if box[0] == "stop":
            break
        if box[0] is not None:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, engine.control.handle(engine.runner, box[0]))
            if future is not None:
                future.set_result(gathered)
        engine.step()
        steps += 1
        time.sleep(STEP_SLEEP_S)
    checks: list[Any] = [None] * world
    dist.all_gather_object(checks, engine.checks())
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"steps": steps, "ranks": checks}))
    if engine.flusher is not None:
        engine.flusher.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--eplb", choices=("on", "off"), default="on")
    parser.add_argument("--duration-s", type=float, default=240.0)
    parser.add_argument("--eplb-async", action="store_true", help="vLLM's default async EPLB (not synchronous)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mp.spawn(run_rank, args=(args.world, args.eplb == "on", args.out, args.duration_s, args.eplb_async),
             nprocs=args.world, join=True)  # fmt: skip


if __name__ == "__main__":
    main()
