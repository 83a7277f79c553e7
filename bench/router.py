"""The router's cost: per-request overhead against direct calls, and proxied requests per second.

Three processes on this machine: the stub upstream (:mod:`bench.stub_upstream`,
raw asyncio, cheap), the router (``moeslo route``, the policy under test) and
this one, the client (raw asyncio HTTP/1.1 over keep-alive connections, so
the client's own cost is small and the same for both paths).  With two or
more CPUs the router gets CPU 0 to itself and the stub and client share CPU 1.

* Overhead: one request at a time, short non-streaming completions, in
  interleaved rounds (direct, proxied, then proxied, direct, ...) so drift in
  the machine's load hits both alike.  Overhead = proxied minus direct latency,
  at the median and the p99 of all requests of each path; plus the share of
  proxied requests slower than the direct median by more than the goal.  The
  load averages before and after say how busy the machine was.
* Throughput: ``connections`` clients sending back to back for
  ``throughput_s``, direct then proxied (interleaved likewise); the direct
  figure is the baseline, the ceiling the stub and client set.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import psutil

from bench.vllm_overhead import tree_cpu_s

REQUEST_BODY = b'{"model":"stub","prompt":"Say hi.","max_tokens":1}'


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterBenchConfig:
    policy: str = "cost"
    rounds: int = 6
    requests_per_round: int = 300
    throughput_rounds: int = 4
    throughput_s: float = 3.0
    connections: int = 32
    goal_overhead_p99_ms: float = 1.0
    goal_requests_per_s: float = 2000.0

    def __post_init__(self) -> None:
        if self.rounds < 2 or self.requests_per_round < 10 or self.throughput_rounds < 2:
            raise ValueError("rounds and throughput_rounds must be >= 2, requests_per_round >= 10")
        if self.throughput_s <= 0 or self.connections < 1:
            raise ValueError("throughput_s must be > 0 and connections >= 1")


class _Connection:
    """One keep-alive HTTP/1.1 connection sending the same POST (Content-Length or chunked answers)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
        self.reader, self.writer, self.request = reader, writer, request

    @classmethod
    async def open(cls, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                   b"content-length: " + str(len(REQUEST_BODY)).encode() + b"\r\n\r\n" + REQUEST_BODY)  # fmt: skip
        return cls(reader, writer, request)

    async def call(self) -> int:
        """Send the request, read the whole answer; its status."""
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        if b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            await self.reader.readexactly(length)
            return status
        while (size := int((await self.reader.readline()).strip(), 16)) > 0:
            await self.reader.readexactly(size + 2)
        await self.reader.readline()
        return status

    def close(self) -> None:
        self.writer.close()


async def _latencies(port: int, count: int) -> list[float]:
    connection = await _Connection.open(port)
    try:
        for _ in range(5):  # warm the path
            await connection.call()
        out = []
        for _ in range(count):
            started = time.perf_counter()
            status = await connection.call()
            out.append(time.perf_counter() - started)
            if status != 200:
                raise RuntimeError(f"HTTP {status} from port {port}")
        return out
    finally:
        connection.close()


async def _throughput(port: int, connections: int, duration_s: float) -> float:
    pool = [await _Connection.open(port) for _ in range(connections)]
    done = 0
    deadline = time.perf_counter() + duration_s

    async def worker(connection: _Connection) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            if await connection.call() != 200:
                raise RuntimeError(f"non-200 answer from port {port}")
            done += 1

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in pool))
    finally:
        for connection in pool:
            connection.close()
    return done / (time.perf_counter() - started)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextmanager
def _process(argv: list[str], cpus: set[int] | None) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if cpus:
            psutil.Process(proc.pid).cpu_affinity(sorted(cpus))
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_router_bench(cfg: RouterBenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start stub and router, measure both figures, return the JSON document."""
    load_before = os.getloadavg()  # other work on the machine: the tail latencies depend on it
    cpus = sorted(os.sched_getaffinity(0))
    router_cpus, other_cpus = ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else (None, None)
    stub_port, router_port = _free_port(), _free_port()
    stub_argv = [sys.executable, "-m", "bench.stub_upstream", str(stub_port)]
    router_argv = [sys.executable, "-m", "cli.main", "route", "--replicas", f"http://127.0.0.1:{stub_port}",
                   "--port", str(router_port), "--policy", cfg.policy]  # fmt: skip
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)
    try:
        with _process(stub_argv, other_cpus), _process(router_argv, router_cpus) as router:
            _wait_ready(f"http://127.0.0.1:{stub_port}/health")
            _wait_ready(f"http://127.0.0.1:{router_port}/health")
            progress("stub and router up")
            figures = asyncio.run(_measure(cfg, stub_port, router_port, router.pid, progress))
    finally:
        os.sched_setaffinity(0, set(cpus))
    layout = {"router_cpus": sorted(router_cpus or cpus), "stub_and_client_cpus": sorted(other_cpus or cpus)}
    return {"benchmark": "router", "config": asdict(cfg), "layout": layout, "cpu_count": len(cpus),
            "load_average_before_after": [load_before, os.getloadavg()], **figures}  # fmt: skip


async def _measure(cfg: RouterBenchConfig, stub_port: int, router_port: int, router_pid: int,
                   progress: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    latencies: dict[str, list[float]] = {"direct": [], "proxied": []}
    rounds = []
    router_proc = psutil.Process(router_pid)
    switches_before = router_proc.num_ctx_switches().involuntary
    for index in range(cfg.rounds):
        order = ("direct", "proxied") if index % 2 == 0 else ("proxied", "direct")
        medians = {}
        for name in order:
            values = await _latencies(stub_port if name == "direct" else router_port, cfg.requests_per_round)
            latencies[name].extend(values)
            medians[name] = statistics.median(values) * 1e3
        rounds.append({"order": list(order), "median_ms": medians})
        progress(f"latency round {index + 1}/{cfg.rounds}: overhead {medians['proxied'] - medians['direct']:.3f} ms")
    preempted = router_proc.num_ctx_switches().involuntary - switches_before
    rates: dict[str, list[float]] = {"direct": [], "proxied": []}
    cpu_before = tree_cpu_s(router_pid)
    for index in range(cfg.throughput_rounds):
        order = ("direct", "proxied") if index % 2 == 0 else ("proxied", "direct")
        for name in order:
            port = stub_port if name == "direct" else router_port
            rates[name].append(await _throughput(port, cfg.connections, cfg.throughput_s))
        progress(f"throughput round {index + 1}/{cfg.throughput_rounds}: proxied {rates['proxied'][-1]:.0f} req/s")
    router_cpu_s = tree_cpu_s(router_pid) - cpu_before
    overhead = _overhead(cfg, latencies, rounds)
    # The router taken off its CPU for another process while it had work: the tail's usual cause on a busy machine.
    overhead["router_involuntary_switches_per_proxied_request"] = preempted / len(latencies["proxied"])
    return {"overhead": overhead, "throughput": _rates(cfg, rates, router_cpu_s)}


def _overhead(cfg: RouterBenchConfig, latencies: dict[str, list[float]], rounds: list[Any]) -> dict[str, Any]:
    stats = {name: {"p50_ms": statistics.median(v) * 1e3, "p99_ms": _percentile(v, 0.99) * 1e3,
                    "requests": len(v)} for name, v in latencies.items()}  # fmt: skip
    p99 = stats["proxied"]["p99_ms"] - stats["direct"]["p99_ms"]
    over = stats["direct"]["p50_ms"] / 1e3 + cfg.goal_overhead_p99_ms / 1e3
    return {
        "proxied_share_over_goal": sum(v > over for v in latencies["proxied"]) / len(latencies["proxied"]),
        "baseline": "direct", "direct": stats["direct"], "proxied": stats["proxied"],
        "overhead_p50_ms": stats["proxied"]["p50_ms"] - stats["direct"]["p50_ms"], "overhead_p99_ms": p99,
        "goal_overhead_p99_ms": cfg.goal_overhead_p99_ms, "goal_met": p99 <= cfg.goal_overhead_p99_ms,
        "rounds": rounds,
    }  # fmt: skip


def _rates(cfg: RouterBenchConfig, rates: dict[str, list[float]], router_cpu_s: float) -> dict[str, Any]:
    direct, proxied = statistics.median(rates["direct"]), statistics.median(rates["proxied"])
    proxied_requests = sum(rates["proxied"]) * cfg.throughput_s
    return {
        "baseline": "direct", "direct_requests_per_s": direct, "proxied_requests_per_s": proxied,
        "proxied_to_direct": proxied / direct, "rounds": rates, "connections": cfg.connections,
        "router_cpu_ms_per_request": 1e3 * router_cpu_s / proxied_requests if proxied_requests else None,
        "goal_requests_per_s": cfg.goal_requests_per_s, "goal_met": proxied >= cfg.goal_requests_per_s,
    }  # fmt: skip


__all__ = ["RouterBenchConfig", "run_router_bench"]
