"""A small real OTLP/HTTP receiver: decodes protobuf export requests with opentelemetry-proto."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class OtlpReceiver:
    def __init__(self) -> None:
        self.metrics: list[Any] = []
        self.traces: list[Any] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    resp = metrics_service_pb2.ExportMetricsServiceResponse()
                    with receiver.lock:
                        receiver.metrics.append(req)
                elif self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    resp = trace_service_pb2.ExportTraceServiceResponse()
                    with receiver.lock:
                        receiver.traces.append(req)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = resp.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def histogram_points(self, name: str) -> list[Any]:
        with self.lock:
            return [
                point
                for req in self.metrics
                for rm in req.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
                if metric.name == name
                for point in metric.histogram.data_points
            ]

    def spans(self) -> list[Any]:
        with self.lock:
            return [span for req in self.traces for rs in req.resource_spans for ss in rs.scope_spans
                    for span in ss.spans]

    def resource_attributes(self) -> dict[str, str]:
        with self.lock:
            return {kv.key: kv.value.string_value for req in self.metrics + self.traces
                    for r in getattr(req, "resource_metrics", None) or req.resource_spans
                    for kv in r.resource.attributes}


@contextmanager
def silent_collector() -> Iterator[str]:
    """An OTLP endpoint on 127.0.0.1 that accepts connections and never answers (its URL)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()
