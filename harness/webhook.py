"""A webhook receiver on 127.0.0.1 that keeps what it is sent (Alertmanager's pages and tickets)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookReceiver:
    """Collects POSTed JSON bodies by path (``/page``, ``/ticket``) until stopped."""

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._posts: list[tuple[str, dict[str, Any]]] = []
        self._received_s: list[float] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    payload = json.loads(body or b"{}")
                except json.JSONDecodeError:
                    payload = {"raw": body.decode(errors="replace")}
                with receiver._lock:
                    receiver._posts.append((self.path, payload))
                    receiver._received_s.append(time.monotonic())
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moeslo-webhook", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def posts(self) -> list[tuple[str, dict[str, Any]]]:
        """Every (path, body) received so far, oldest first."""
        with self._lock:
            return list(self._posts)

    @property
    def timed_posts(self) -> list[tuple[str, dict[str, Any], float]]:
        """Every (path, body, when it came in: ``time.monotonic()``) so far, oldest first."""
        with self._lock:
            return [(path, body, at) for (path, body), at in zip(self._posts, self._received_s, strict=True)]

    def alerts(self, path: str) -> list[dict[str, Any]]:
        """The alerts of every notification posted to ``path``."""
        return [alert for where, body in self.posts if where == path for alert in body.get("alerts", [])]

    def wait_for(
        self, path: str, predicate: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> list[dict[str, Any]]:
        """Alerts posted to ``path`` that satisfy ``predicate``, waiting up to ``timeout_s``; [] when none came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [a for a in self.alerts(path) if predicate(a)]
            if found:
                return found
            time.sleep(0.2)
        return []

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def webhook_receiver(port: int = 0) -> Iterator[WebhookReceiver]:
    """A running receiver, stopped on exit."""
    receiver = WebhookReceiver(port)
    try:
        yield receiver
    finally:
        receiver.stop()


__all__ = ["WebhookReceiver", "webhook_receiver"]
