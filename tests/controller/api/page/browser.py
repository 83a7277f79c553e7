"""Headless Debian chromium under Playwright, and the controller served by uvicorn on 127.0.0.1, for browser tests.

Playwright drives the system's ``/usr/bin/chromium`` (``executable_path``); nothing is downloaded
(``playwright install`` is never run).  Tests skip with the reason when either is missing.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from harness.processes import free_port

ROOT = Path(__file__).resolve().parents[4]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    path = os.environ.get("MOESLO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install chromium chromium-driver)")
    return path


def artifacts_dir() -> Path:
    """Where screenshots are kept (ignored by git; MOESLO_TEST_ARTIFACTS moves it)."""
    folder = Path(os.environ.get("MOESLO_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "status-page"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def browser() -> Iterator[Any]:
    """A Playwright chromium browser (the system's), closed afterwards."""
    executable = chromium_path()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on a free loopback port, in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="status-page-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
