"""Writes are judged by their token and their declared size before their body is read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message

from controller.api import create_app
from controller.api.auth import MAX_BODY_BYTES
from controller.config import ControllerSettings
from controller.store import Store
from tests.controller.api.conftest import AUTH, TOKEN, make_client


def _app(tmp_path: Path) -> FastAPI:
    config = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    return create_app(config, Store(config.db_url))


def _call(app: FastAPI, method: str, path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, int]:
    """(status, body bytes the app asked for) of one request sent straight to the ASGI app."""
    messages: list[Message] = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                               for i, c in enumerate(chunks)]  # fmt: skip
    read: list[int] = []
    sent: list[Message] = []

    async def receive() -> Message:
        if not messages:
            await asyncio.sleep(3600)  # a client that has nothing more to send
        message = messages.pop(0)
        read.append(len(message["body"]))
        return message

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), sum(read)


def test_a_write_without_the_token_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    """A stranger's 40 MiB body was read and parsed (2 s of the event loop, 240 MiB) before its 401."""
    big = 40 * 1024 * 1024
    headers = {"Content-Type": "application/json", "Content-Length": str(big)}
    status, read = _call(_app(tmp_path), "PUT", "/v1/policies/x", headers, [b"[" + b"1," * 1000, b"1]"])
    assert (status, read) == (401, 0)


def test_a_body_declared_too_large_is_413_before_it_is_read(tmp_path: Path) -> None:
    headers = {**AUTH, "Content-Type": "application/json", "Content-Length": str(MAX_BODY_BYTES + 1)}
    status, read = _call(_app(tmp_path), "POST", "/v1/policies", headers, [b"{", b"}"])
    assert (status, read) == (413, 0)


def test_a_body_sent_in_chunks_is_413_once_it_grows_past_the_limit(tmp_path: Path) -> None:
    chunk = b" " * (1024 * 1024)
    chunks = [b"{", *[chunk] * 10, b"}"]
    status, read = _call(_app(tmp_path), "PATCH", "/v1/policies/x", {**AUTH, "Content-Type": "application/json"},
                         chunks)  # fmt: skip
    assert status == 413 and read <= MAX_BODY_BYTES + len(chunk)


def _largest_policy() -> dict[str, Any]:
    """A policy at every length limit (256 target endpoints and 64 router ones of 2048 characters, 1000 profile
    points, 16 labels of 1024 characters)."""
    url = "http://replica.example:8000/" + "p" * (2048 - 28)
    point = {"request_rate_rps": 1.0e3, "prompt_tokens_per_s": 1.0e6, "output_tokens_per_s": 1.0e5,
             "ttft_p99_s": 0.123456789, "itl_p99_s": 0.0123456789, "ttft_p50_s": 0.1, "itl_p50_s": 0.01,
             "requests": 1_000_000}  # fmt: skip
    profile = {"prefill_tokens_per_s": 8000.0, "itl_base_s": 0.007, "itl_per_seq_s": 0.0002,
               "kv_capacity_tokens": 100_000, "source": "s" * 4096, "points": [point] * 1000}  # fmt: skip
    return {
        "name": "big", "description": "d" * 1024, "profile": profile,
        "target": {"kind": "local", "checkpoint": "c" * 4096, "endpoints": [f"{url[:-4]}{i:04}" for i in range(256)]},
        "router": {"endpoints": [f"{url[:-4]}{i:04}" for i in range(64)],
                   "prometheus_labels": {f"l{i}": "v" * 1024 for i in range(16)}},
    }  # fmt: skip


def test_the_largest_valid_policy_fits_the_limit_with_room(tmp_path: Path) -> None:
    body = json.dumps(_largest_policy()).encode()
    assert len(body) * 3 < MAX_BODY_BYTES
    with make_client(tmp_path) as client:
        response = client.put("/v1/policies/big", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 201, response.text[:500]


def test_unknown_paths_and_methods_answer_as_before_without_the_token(tmp_path: Path) -> None:
    client = TestClient(_app(tmp_path))
    assert client.delete("/health").status_code == 405
    assert client.post("/v1/nowhere", json={}).status_code == 404
    assert client.post("/v1/policies", json={}).status_code == 401
