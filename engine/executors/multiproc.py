"""Expert parallelism across processes (``--ep N``).

Rank 0 is this process: it runs attention, routers and dense layers, owns
the KV cache, and holds its share of the experts.  Ranks 1..N-1 are spawned
processes that hold only their own expert slots.

Per MoE layer and step, over shared memory (the ranks share one host):

* **dispatch**: rank 0 writes the normalized hidden states with each token's
  top-k weights and physical slots (one packed float32 tensor) into a buffer
  every rank maps, and tells each rank the layer and token count through its
  pipe.  Every rank picks the assignments whose slot it holds.  This is the
  all-to-all of EP done as a broadcast: on one host the bytes are the same
  order, and ranks need no per-peer sizes.
* **combine**: each rank writes its experts' outputs into its own shared
  output buffer and answers on its pipe; rank 0 sums them into its own.

A step costs one small pipe message each way per rank and MoE layer.  gloo's
collectives took several thread hand-offs each (the caller, the process
group's worker, the transport's loop), which on ranks sharing a CPU cost
about 1 ms per collective: a step of the demo's replica (EP 2 on one CPU)
took 13 ms against 4 ms at EP 1.  A rank that exits closes its pipe, so rank
0 sees it at once (EOF), not after a collective's timeout.  So too at
startup: each rank loads its experts, then reports on its pipe (ready, or
its error) before any rank joins the group, so a rank that fails to load or
dies is named with its exit status within moments.

Placement changes (rare) still go through a ``torch.distributed`` group
(gloo): they move only the expert weights that change rank, with
point-to-point sends between the ranks that hold them and the ranks that
need them; each rank builds its new slots aside and switches at the end.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import signal
import struct
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C

from contracts.errors import PlacementError, UnavailableError, ValidationError
from contracts.lifetime import die_with_parent
from contracts.placement import Placement
from engine.checkpoint import CheckpointReader, torch_dtype
from engine.config import ModelConfig
from engine.executors.base import DriverBase, ExecutorOptions, default_threads, expert_bytes, use_step_threads
from engine.experts import ExpertShard, ExpertWeights, Transfer, load_expert, plan_transfers
from engine.model import StepMetadata

log = logging.getLogger("moeslo.engine_core")
_OP_LAYER, _OP_PLACEMENT, _OP_SHUTDOWN, _OP_RESIZE = 1, 2, 3, 4
_TIMEOUT = timedelta(seconds=120)
_MESSAGE = struct.Struct("<iii")
"""A pipe message from rank 0: (op, MoE layer, tokens)."""
_DONE = b"d"
_READY = b"r"
"""A worker's first message: its experts are loaded and it is joining the group."""
_FAILED = b"f"
"""A worker's first message when it could not load: followed by the error's text."""
_MAX_ERROR = 2000
_FIRST_CAPACITY = 512
"""Tokens the shared buffers hold at first (the default step budget); they grow by doubling."""


class _SharedBuffers:
    """The packed dispatch rows (rank 0 writes) and one output buffer per rank (that rank writes)."""

    def __init__(self, capacity: int, width: int, hidden: int, world: int) -> None:
        self.capacity = capacity
        self.inbox = _shared((capacity, width))
        self.outboxes = [_shared((capacity, hidden)) for _ in range(world)]


def _shared(shape: tuple[int, int]) -> torch.Tensor:
    tensor = torch.empty(shape, dtype=torch.float32)
    tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


def _backend() -> str:
    # The embedded engine keeps its tensors on the CPU, so gloo even where CUDA is present
    # (nccl takes only CUDA tensors; a CUDA engine is not built yet).
    return "gloo"


def _exchange(shard: ExpertShard, transfers: list[Transfer], rank: int) -> dict[tuple[int, int], ExpertWeights]:
    """Send the weights this rank is a source of; receive those it needs."""
    config = shard.config
    inter, hidden = config.moe_intermediate_size, config.hidden_size
    dtype = shard.w13[0].dtype if shard.w13 else torch.float32
    pending = []
    received: dict[tuple[int, int], ExpertWeights] = {}
    for index, tr in enumerate(transfers):
        if tr.src == rank:
            w13, w2 = shard.weights_of(tr.layer, tr.expert)
            pending.append(dist.isend(w13.contiguous(), dst=tr.dst, tag=2 * index))
            pending.append(dist.isend(w2.contiguous(), dst=tr.dst, tag=2 * index + 1))
        elif tr.dst == rank:
            w13 = torch.empty((2 * inter, hidden), dtype=dtype)
            w2 = torch.empty((hidden, inter), dtype=dtype)
            pending.append(dist.irecv(w13, src=tr.src, tag=2 * index))
            pending.append(dist.irecv(w2, src=tr.src, tag=2 * index + 1))
            received[(tr.layer, tr.expert)] = (w13, w2)
    for work in pending:
        if work is not None:
            work.wait()
    return received


class _RankState:
    """What every rank keeps to serve dispatches: its shard and the packed-row layout."""

    def __init__(self, config: ModelConfig, shard: ExpertShard, dtype: torch.dtype) -> None:
        self.config = config
        self.shard = shard
        self.dtype = dtype
        self.hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok

    def compute(self, layer: int, packed: torch.Tensor) -> torch.Tensor:
        """This rank's expert outputs for one dispatched layer, as float32."""
        h, k = self.hidden, self.top_k
        x = packed[:, :h].to(self.dtype)
        weights = packed[:, h : h + k].to(self.dtype)
        physical = packed[:, h + k :].long()
        out = torch.zeros_like(x)
        self.shard.compute(layer, x, weights, physical, out)
        return out.float()

    def apply(self, new: Placement) -> tuple[int, int]:
        """Exchange weights, build the new slots aside, and switch only if every rank could."""
        transfers = plan_transfers(self.shard.placement, new)
        received = _exchange(self.shard, transfers, self.shard.rank)
        layers = None
        failure = ""
        try:
            layers = self.shard.prepare(new, received)
        except Exception as exc:  # e.g. MemoryError: report it, keep the old slots
            failure = f"rank {self.shard.rank}: {exc!r}"
        ok = torch.tensor([0 if layers is None else 1], dtype=torch.long)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if layers is None or int(ok[0]) == 0:
            raise PlacementError(f"placement swap failed ({failure or 'on another rank'}); the old placement stays")
        self.shard.commit(new, layers)
        return len(transfers), len(transfers) * expert_bytes(self.config, self.dtype)


def _worker_main(rank: int, world: int, port: int, options: ExecutorOptions, placement: Placement,
                 conn: Connection, buffers: _SharedBuffers, parent: int | None) -> None:  # fmt: skip
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the engine core: its parent stops it, not Ctrl-C
    if parent is not None:  # a core killed before its ranks joined would otherwise leave them waiting
        die_with_parent()
        if os.getppid() != parent:
            return  # it died before the request above could take effect
    threads = options.threads_per_rank or default_threads(world)
    torch.set_num_threads(threads)
    try:
        state = _load_rank(rank, options, placement)
    except Exception as exc:  # rank 0 reports it: the error, not only a peer gone from the group
        with contextlib.suppress(OSError):
            conn.send_bytes(_FAILED + repr(exc)[:_MAX_ERROR].encode())
        raise
    conn.send_bytes(_READY)
    store = TCPStore("127.0.0.1", port, world, is_master=False, timeout=_TIMEOUT)
    dist.init_process_group(_backend(), store=store, rank=rank, world_size=world, timeout=_TIMEOUT)
    try:
        _serve(state, rank, world, threads, options, conn, buffers)
    finally:
        dist.destroy_process_group()


def _load_rank(rank: int, options: ExecutorOptions, placement: Placement) -> _RankState:
    """A worker rank's experts, read from the checkpoint."""
    config = ModelConfig.load(options.checkpoint)
    dtype = torch_dtype(options.dtype or config.torch_dtype)
    with CheckpointReader(options.checkpoint, dtype) as reader:
        shard = ExpertShard(
            config, placement, rank, lambda layer, expert: load_expert(reader, config.sparse_layers[layer], expert)
        )
    return _RankState(config, shard, dtype)


def _serve(state: _RankState, rank: int, world: int, threads: int, options: ExecutorOptions, conn: Connection,
           buffers: _SharedBuffers) -> None:  # fmt: skip
    """Answer rank 0's messages until it says shut down or goes away."""
    with torch.inference_mode(), contextlib.suppress(EOFError, ConnectionError):  # rank 0 went away: stop
        while True:
            op, layer, tokens = _MESSAGE.unpack(conn.recv_bytes())
            if op == _OP_LAYER:
                use_step_threads(tokens, threads, options.parallel_min_tokens)  # as rank 0 runs the step
                buffers.outboxes[rank][:tokens].copy_(state.compute(layer, buffers.inbox[:tokens]))
                conn.send_bytes(_DONE)
            elif op == _OP_RESIZE:
                received = conn.recv()
                assert isinstance(received, _SharedBuffers)
                buffers = received
                conn.send_bytes(_DONE)
            elif op == _OP_PLACEMENT:
                box: list[object] = [None]
                dist.broadcast_object_list(box, src=0)
                assert isinstance(box[0], np.ndarray)
                with contextlib.suppress(PlacementError):  # rank 0 reports it; the ranks agree
                    state.apply(Placement(box[0], world))
                dist.barrier()
            else:
                break


def _first_message(conn: Connection) -> bytes:
    """A starting rank's report; empty if it exited without one."""
    try:
        return conn.recv_bytes(len(_FAILED) + 4 * _MAX_ERROR)
    except (EOFError, OSError):
        return b""


class MultiprocExecutor(DriverBase):
    """N expert-parallel ranks: this process is rank 0, the others are spawned."""

    def __init__(self, options: ExecutorOptions) -> None:
        world = options.ep
        if dist.is_initialized():
            raise ValidationError(
                "this process already runs an expert-parallel executor; shut it down before starting another"
            )
        torch.set_num_threads(options.threads_per_rank or default_threads(world))
        super().__init__(options, num_ranks=world)
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._closed = False
        self._broken: str | None = None
        cfg = self._config
        self._buffers = _SharedBuffers(_FIRST_CAPACITY, cfg.hidden_size + 2 * cfg.num_experts_per_tok,
                                       cfg.hidden_size, world)  # fmt: skip
        # Before spawning: children copy the environment, and every rank must bind loopback.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # Rank 0's rendezvous store takes a port the OS picks; the workers get its number.
        store = TCPStore("127.0.0.1", 0, world, is_master=True, timeout=_TIMEOUT, wait_for_workers=False)
        try:
            self._spawn(options, store.port)
            reader = self.reader
            shard = ExpertShard(  # while the other ranks load theirs
                cfg, self._placement, 0, lambda layer, expert: load_expert(reader, cfg.sparse_layers[layer], expert)
            )
            self._state = _RankState(cfg, shard, self.dtype)
            self._await_ready()
            # Joined only once every rank has loaded and was alive a moment ago: gloo's rendezvous waits out
            # its whole timeout for a peer that never joins, naming no rank.  Only a rank that dies in the
            # milliseconds between its report and the group forming can still cost that wait (the error then
            # names it).  Not a shorter timeout for the join: the group keeps it for every collective after.
            self._raise_if_dead(self._dead_rank())
            dist.init_process_group(_backend(), store=store, rank=0, world_size=world, timeout=_TIMEOUT)
        except BaseException as exc:
            self._closed = True
            # A failed join (or a load cut short) may be a rank that died: name it, not gloo's error.
            named = isinstance(exc, UnavailableError) or not isinstance(exc, Exception)
            dead = None if named else self._dead_rank(wait_s=0.5)
            self._teardown(grace_s=0)  # the other ranks have nothing to save
            self._raise_if_dead(dead, exc)
            raise

    def _spawn(self, options: ExecutorOptions, port: int) -> None:
        """Start ranks 1..N-1; each loads its experts, reports on its pipe and joins the group at ``port``."""
        ctx = mp.get_context("spawn")
        parent = os.getpid() if threading.current_thread() is threading.main_thread() else None
        for rank in range(1, options.ep):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_worker_main,
                args=(rank, options.ep, port, options, self._placement, theirs, self._buffers, parent),
                daemon=True, name=f"moeslo-ep-rank{rank}",
            )
            proc.start()
            theirs.close()  # the child holds its end: a rank that exits closes the pipe
            self._procs.append(proc)
            self._conns.append(mine)

    def _await_ready(self) -> None:
        """Wait until every rank has loaded its experts; UnavailableError naming the first that failed or exited."""
        pending = dict(enumerate(self._conns, start=1))
        deadline = time.monotonic() + _TIMEOUT.total_seconds()
        while pending:
            watched: list[Connection | int] = [*pending.values(), *(self._procs[r - 1].sentinel for r in pending)]
            ready = multiprocessing.connection.wait(watched, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise UnavailableError(f"expert-parallel ranks {sorted(pending)} did not load within {_TIMEOUT}")
            for rank, conn in list(pending.items()):
                if conn in ready or self._procs[rank - 1].sentinel in ready:
                    message = _first_message(conn)
                    if message != _READY:
                        raise UnavailableError(self._startup_failure(rank, message))
                    del pending[rank]

    def _startup_failure(self, rank: int, message: bytes) -> str:
        proc = self._procs[rank - 1]
        proc.join(5)  # a rank that reported its error exits right after
        status = "failed" if proc.exitcode is None else f"exited with status {proc.exitcode}"
        error = message[len(_FAILED) :].decode(errors="replace") if message.startswith(_FAILED) else ""
        return f"expert-parallel rank {rank} (pid {proc.pid}) {status} while starting" + (f": {error}" if error else "")

    @staticmethod
    def _raise_if_dead(dead: str | None, cause: BaseException | None = None) -> None:
        if dead is not None:
            raise UnavailableError(f"{dead} while starting") from cause

    @property
    def broken(self) -> str | None:
        """Why the group cannot run steps: a step or swap failed, or a rank process exited (checked on every
        read: ``is_alive`` also reaps the exited process, so no zombie stays)."""
        if self._broken is None and not self._closed:
            self._broken = self._dead_rank()
        return self._broken

    def _dead_rank(self, wait_s: float = 0.0) -> str | None:
        """Which rank exited, waiting up to ``wait_s`` for one to (a collective fails before the exit is seen)."""
        if wait_s > 0:
            ready = multiprocessing.connection.wait([p.sentinel for p in self._procs], timeout=wait_s)
            for proc in self._procs:
                if proc.sentinel in ready:
                    proc.join(wait_s)  # its pipe closes a moment before the process can be reaped
        for rank, proc in enumerate(self._procs, start=1):
            if not proc.is_alive():
                reason = f"expert-parallel rank {rank} (pid {proc.pid}) exited with status {proc.exitcode}"
                log.error("%s; the engine stops serving until its supervisor restarts it", reason)
                return reason
        return None

    def _guard(self) -> None:
        if self.broken is not None:
            raise UnavailableError(f"the expert-parallel group is broken ({self._broken}); restart the engine")

    def _forward(self, meta: StepMetadata) -> torch.Tensor:
        self._guard()
        try:
            self._fit(meta.token_ids.shape[0])
            return super()._forward(meta)
        except Exception as exc:
            # A rank may be inside this step's layer: the group cannot be trusted again.
            log.error("expert-parallel step failed: %r", exc)
            self._broken = self._dead_rank(wait_s=0.5) or "an expert-parallel step failed"
            raise UnavailableError(self._broken) from exc

    def _send_all(self, op: int, layer: int = 0, tokens: int = 0) -> None:
        message = _MESSAGE.pack(op, layer, tokens)
        for conn in self._conns:
            conn.send_bytes(message)

    def _wait_all(self) -> None:
        """Every rank's answer; EOFError when one exited, TimeoutError when one went silent."""
        for rank, conn in enumerate(self._conns, start=1):
            if not conn.poll(_TIMEOUT.total_seconds()):
                raise TimeoutError(f"expert-parallel rank {rank} did not answer within {_TIMEOUT}")
            if conn.recv_bytes() != _DONE:
                raise ConnectionError(f"expert-parallel rank {rank} answered out of turn")

    def _fit(self, tokens: int) -> None:
        """Grow the shared buffers (by doubling) to hold a step of ``tokens``, and hand them to every rank."""
        if tokens <= self._buffers.capacity:
            return
        capacity = self._buffers.capacity
        while capacity < tokens:
            capacity *= 2
        old = self._buffers
        self._buffers = _SharedBuffers(capacity, old.inbox.shape[1], old.outboxes[0].shape[1], len(old.outboxes))
        self._send_all(_OP_RESIZE)
        for conn in self._conns:
            conn.send(self._buffers)
        self._wait_all()

    def _dispatch(
        self, layer: int, x: torch.Tensor, weights: torch.Tensor, physical: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        tokens = x.shape[0]
        packed = self._buffers.inbox[:tokens]
        torch.cat([x.float(), weights.float(), physical.float()], dim=1, out=packed)
        self._send_all(_OP_LAYER, layer, tokens)
        out = self._state.compute(layer, packed)  # rank 0's share, while the other ranks compute theirs
        self._wait_all()
        for outbox in self._buffers.outboxes[1:]:
            out += outbox[:tokens]
        return out.to(x.dtype)

    def _swap(self, placement: Placement) -> tuple[int, int]:
        self._guard()
        try:
            self._send_all(_OP_PLACEMENT)
            dist.broadcast_object_list([placement.phy2log], src=0)
            try:
                moved = self._state.apply(placement)
            finally:
                dist.barrier()
        except PlacementError:
            raise
        except Exception as exc:
            log.error("expert-parallel placement swap failed: %r", exc)
            self._broken = self._dead_rank(wait_s=0.5) or "an expert-parallel placement swap failed"
            raise UnavailableError(self._broken) from exc
        return moved

    def shutdown(self) -> None:
        if self._closed:
            return
        healthy = self.broken is None  # a dead rank would never answer the shutdown broadcast
        self._closed = True
        try:
            if healthy:
                with contextlib.suppress(OSError):  # a rank that just exited has closed its pipe
                    self._send_all(_OP_SHUTDOWN)
        finally:
            self._teardown()

    def _teardown(self, grace_s: float = 10) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        for conn in self._conns:
            conn.close()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        super().shutdown()
