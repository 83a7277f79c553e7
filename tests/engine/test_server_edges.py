"""The API's edges against the served engine: odd but well-formed inputs are 400s naming their field, never 500s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.test_server import Served, serve
from tests.engine.test_server_hardening import _is_error_document

pytestmark = pytest.mark.integration

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"prompt": "hi", "max_tokens": 1}


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path) -> Iterator[Served]:
    server, engine = serve(tiny_checkpoint)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Served(server.url, engine, client)
    server.stop()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("key", ["--5", "-", "5-", "\u00b2", "\u2460", "\uff15", "\u0665", " 5", "5\n", "1" * 5000, ""])
def test_logit_bias_keys_that_are_not_ascii_integers_are_400_naming_the_field(
    served: Served, route: str, key: str
) -> None:
    base = COMPLETION if route == "/v1/completions" else CHAT
    resp = served.client.post(route, json={**base, "logit_bias": {key: 1}})
    assert resp.status_code == 400, resp.text
    error = _is_error_document(resp)
    assert error["param"] == "logit_bias" and "token ids" in str(error["message"])
