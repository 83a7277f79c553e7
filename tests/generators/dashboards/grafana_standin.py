"""A stand-in for the parts of Grafana's HTTP API that ``moeslo dashboards push`` uses, on loopback.

POST /api/dashboards/db (create/overwrite by uid, versioned), GET /api/dashboards/uid/<uid>,
GET/POST /api/folders; bearer-token auth; 400 on a dashboard without title or uid.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class GrafanaStandIn:
    url: str
    token: str
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    folders: dict[str, str] = field(default_factory=dict)
    placed_in: dict[str, str | None] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)


@contextmanager
def grafana_standin(token: str = "sa-token") -> Iterator[GrafanaStandIn]:
    state: GrafanaStandIn

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            state.requests.append((self.command, self.path))
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                self._reply(401, {"message": "invalid API key"})
                return False
            return True

        def _body(self) -> Any:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path.startswith("/api/dashboards/uid/"):
                uid = self.path.rsplit("/", 1)[1]
                if uid not in state.dashboards:
                    self._reply(404, {"message": "Dashboard not found"})
                    return
                self._reply(200, {"dashboard": state.dashboards[uid], "meta": {"version": state.versions[uid]}})
            elif self.path.startswith("/api/folders/"):
                uid = self.path.rsplit("/", 1)[1]
                if uid not in state.folders:
                    self._reply(404, {"message": "folder not found"})
                    return
                self._reply(200, {"uid": uid, "title": state.folders[uid]})
            else:
                self._reply(404, {"message": "not found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = self._body()
            if self.path == "/api/folders":
                state.folders[body["uid"]] = body["title"]
                self._reply(200, {"uid": body["uid"], "title": body["title"]})
            elif self.path == "/api/dashboards/db":
                dashboard = body.get("dashboard") or {}
                if not dashboard.get("title") or not dashboard.get("uid"):
                    self._reply(400, {"message": "Dashboard title cannot be empty"})
                    return
                uid = dashboard["uid"]
                if uid in state.dashboards and not body.get("overwrite"):
                    self._reply(412, {"status": "version-mismatch"})
                    return
                folder = body.get("folderUid")
                if folder is not None and folder not in state.folders:
                    self._reply(400, {"message": "folder not found"})
                    return
                state.dashboards[uid] = dashboard
                state.versions[uid] = state.versions.get(uid, 0) + 1
                state.placed_in[uid] = folder
                self._reply(200, {"id": len(state.dashboards), "uid": uid, "status": "success",
                                  "version": state.versions[uid], "url": f"/d/{uid}/{uid}", "slug": uid})
            else:
                self._reply(404, {"message": "not found"})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = GrafanaStandIn(url=f"http://127.0.0.1:{server.server_port}", token=token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
