"""A static engine /metrics page on loopback, with vLLM's metric names, for source tests."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from contracts.catalogue import (
    ITL_BUCKETS_S,
    PREFILL_TIME_HISTOGRAM,
    PROMPT_TOKENS_BUCKETS,
    REQUEST_PROMPT_TOKENS_HISTOGRAM,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    TTFT_BUCKETS_S,
    VLLM_ITL_BUCKETS_S,
)


class EngineMetrics:
    """vLLM-named series for one engine serving ``model``; ``reset()`` simulates a restart."""

    def __init__(self, model: str, *, engine: str = "0", stock_vllm_itl: bool = False) -> None:
        self.model = model
        self.engine = engine
        self.stock_vllm_itl = stock_vllm_itl
        self.reset()

    def reset(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = {"model_name": self.model, "engine": self.engine}
        itl_buckets = VLLM_ITL_BUCKETS_S if self.stock_vllm_itl else ITL_BUCKETS_S
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", labels, buckets=TTFT_BUCKETS_S,
                              registry=self.registry).labels(**values)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", labels, buckets=itl_buckets,
                             registry=self.registry).labels(**values)
        self.waiting = Gauge("vllm:num_requests_waiting", "w", labels, registry=self.registry).labels(**values)
        self.running = Gauge("vllm:num_requests_running", "r", labels, registry=self.registry).labels(**values)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=self.registry).labels(**values)
        self.success = Counter("vllm:request_success", "ok", [*labels, "finished_reason"],
                               registry=self.registry).labels(**values, finished_reason="stop")
        self.generation = Counter("vllm:generation_tokens", "gen", labels, registry=self.registry).labels(**values)
        self.cv = Gauge("moe_layer_imbalance_cv", "cv", [*labels, "layer"], registry=self.registry)
        self.prompt = Histogram(REQUEST_PROMPT_TOKENS_HISTOGRAM, "prompt", labels, buckets=PROMPT_TOKENS_BUCKETS,
                                registry=self.registry).labels(**values)
        self.prefill = Histogram(PREFILL_TIME_HISTOGRAM, "prefill", labels, registry=self.registry).labels(**values)
        self.without_first_token = Counter(REQUESTS_WITHOUT_FIRST_TOKEN, "no first token", [*labels, "finished_reason"],
                                           registry=self.registry)  # fmt: skip

    def ended_before_first_token(self, count: int, reason: str) -> None:
        """Requests the engine ended before their first token (in no TTFT histogram)."""
        self.without_first_token.labels(model_name=self.model, engine=self.engine, finished_reason=reason).inc(count)

    def requests(self, ttft_s: list[float], itl_s: list[float] | None = None) -> None:
        for value in ttft_s:
            self.ttft.observe(value)
            self.success.inc()
        for value in itl_s or []:
            self.itl.observe(value)
            self.generation.inc()

    def prefills(self, prompt_tokens: list[int], prefill_s: list[float]) -> None:
        """Finished requests' prompt lengths and prefill times (vLLM records both when a request finishes)."""
        for tokens, seconds in zip(prompt_tokens, prefill_s, strict=True):
            self.prompt.observe(tokens)
            self.prefill.observe(seconds)

    def set_imbalance(self, per_layer: list[float]) -> None:
        for layer, cv in enumerate(per_layer):
            self.cv.labels(model_name=self.model, engine=self.engine, layer=str(layer)).set(cv)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves ``engine.render()`` at /metrics on 127.0.0.1 until stopped."""

    def __init__(self, engine: EngineMetrics, port: int = 0) -> None:
        self.engine = engine
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = owner.engine.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class RouterPage:
    """The entry router's own /metrics series (its real :class:`router.metrics.RouterMetrics`), for source tests."""

    def __init__(self, replicas: tuple[str, ...] = ("http://engine:8000",)) -> None:
        from router.metrics import RouterMetrics

        self.registry = CollectorRegistry()
        self.metrics = RouterMetrics(self.registry, replicas)

    def hold(self, requests: int) -> None:
        """``requests`` held at admission (queue mode)."""
        self.metrics.queued.set(requests)

    def refuse(self, requests: int) -> None:
        """``requests`` refused at admission (reject mode: 429), counted as the router counts them."""
        from contracts.catalogue import REJECTED_OUTCOME

        for _ in range(requests):
            self.metrics.request(None, "all_over_budget", REJECTED_OUTCOME)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TrickleServer:
    """An endpoint that answers one byte every ``every_s`` seconds on 127.0.0.1 (a stuck or overloaded replica):
    each socket read gets data in time, so only a bound on the whole read ends it."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
                while not self.stopped.wait(self.every_s):
                    conn.sendall(b"#")
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
