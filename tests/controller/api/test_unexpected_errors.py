"""A bug of ours behind the REST API: a 500 problem document, and the client's connection still serves."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from tests.controller.api.page.browser import serving

pytestmark = pytest.mark.integration


def test_an_unexpected_error_is_a_500_problem_and_the_keep_alive_connection_serves_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = ControllerSettings(db=str(tmp_path / "c.db"))
    store = Store(config.db_url)

    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("a bug of ours")

    def local_port(resp: httpx.Response) -> int:
        return int(resp.extensions["network_stream"].get_extra_info("client_addr")[1])

    with serving(create_app(config, store)) as url, httpx.Client(base_url=url, timeout=30) as client:
        monkeypatch.setattr(store, "read_policies", boom)
        failed = client.get("/v1/policies")
        monkeypatch.undo()
        served_next = [client.get("/v1/policies") for _ in range(3)]
        ports = {local_port(resp) for resp in [failed, *served_next]}
    assert failed.status_code == 500, failed.text
    assert failed.headers["content-type"].startswith("application/problem+json")
    assert failed.json()["status"] == 500 and "a bug of ours" not in failed.text
    assert [resp.status_code for resp in served_next] == [200, 200, 200]
    assert len(ports) == 1, "a request needed a new connection"
    logged = [r for r in caplog.records if r.exc_info is not None and "a bug of ours" in str(r.exc_info[1])]
    assert logged
