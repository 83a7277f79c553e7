"""The REST client's errors: whatever body a failing answer has, the error carries the server's words."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from contracts.errors import MoesloError, UnavailableError, ValidationError
from controller import api_client


def _answering(monkeypatch: pytest.MonkeyPatch, status: int, body: bytes) -> None:
    def send(method: str, url: str, **_kwargs: Any) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "application/json"},
                              request=httpx.Request(method, url))  # fmt: skip

    monkeypatch.setattr(httpx, "request", send)


@pytest.mark.parametrize(
    ("status", "body", "error", "said"),
    [
        (502, b'["upstream error"]', UnavailableError, 'HTTP 502: ["upstream error"]'),
        (502, b'"Bad Gateway"', UnavailableError, 'HTTP 502: "Bad Gateway"'),
        (500, b"null", UnavailableError, "HTTP 500: null"),
        (422, b'{"detail": "name: too long"}', ValidationError, "HTTP 422: name: too long"),
    ],
)
def test_an_error_body_that_is_no_object_is_shown_as_sent(
    monkeypatch: pytest.MonkeyPatch, status: int, body: bytes, error: type[MoesloError], said: str
) -> None:
    """A JSON body that is not an object (a proxy's list or string, ``null``) raised AttributeError from
    ``.get``: a traceback instead of the answer."""
    _answering(monkeypatch, status, body)
    with pytest.raises(error) as caught:
        api_client.request("GET", "http://controller/v1/policies/a")
    assert str(caught.value) == said
