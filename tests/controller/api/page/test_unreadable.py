"""A stored policy this controller cannot read (written by a newer version, or before a rule was tightened):
``/v1/status`` names it, the overview says so and how to fix it, and its page is a page, not a JSON 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import UnavailableError
from tests.controller.api.conftest import AUTH, make_client
from tests.controller.store.test_unreadable_policies import spoil


def _one_spoilt(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        for name in ("good", "newer"):
            created = client.post("/v1/policies", json={"name": name, "target": {"kind": "model", "model": name}},
                                  headers=AUTH)  # fmt: skip
            assert created.status_code == 201, created.text
    spoil(tmp_path / "c.db", "newer")


def test_the_status_names_it_and_the_overview_shows_it_with_the_fix(tmp_path: Path) -> None:
    """It was left out of /v1/status and the overview without a word: a policy that runs no more, unseen."""
    _one_spoilt(tmp_path)
    with make_client(tmp_path) as client:
        status = client.get("/v1/status").json()
        assert [p["name"] for p in status["policies"]] == ["good"]
        [unreadable] = status["unreadable"]
        assert (unreadable["name"], unreadable["version"]) == ("newer", 1)
        assert "surprise: Extra inputs are not permitted" in unreadable["problem"]
        html = client.get("/ui/").text
        assert 'data-banner="unreadable"' in html and 'data-unreadable="newer"' in html
        assert "surprise: Extra inputs are not permitted" in html
        assert "PUT /v1/policies/newer" in html and 'If-Match: "1"' in html
        assert "DELETE /v1/policies/newer" in html
        assert 'data-banner="unreadable"' not in client.get("/ui/?q=good").text  # the filter holds for them too


def test_its_page_is_html_saying_why_and_the_fix(tmp_path: Path) -> None:
    _one_spoilt(tmp_path)
    with make_client(tmp_path) as client:
        response = client.get("/ui/policies/newer")
        assert response.status_code == 500
        assert response.headers["content-type"].startswith("text/html")
        assert "cannot read policy newer" in response.text and "PUT /v1/policies/newer" in response.text
        assert client.get("/v1/status/newer").headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("error", "status", "shown"),
    [(UnavailableError("policy store (sqlite): disk I/O error"), 503, "policy store (sqlite): disk I/O error"),
     (RuntimeError("a bug of ours"), 500, "internal error (details are in the server log)")],
)
def test_an_error_on_a_ui_path_is_a_page(tmp_path: Path, error: Exception, status: int, shown: str) -> None:
    """A MoesloError under /ui/ answered a problem document, where a bad query value answers a page; so did a bug
    of ours (a 500 whose details stay in the server log)."""
    with make_client(tmp_path) as client:
        store = client.app.state.store  # type: ignore[attr-defined]

        def broken(*_args: object, **_kwargs: object) -> None:
            raise error

        store.read_policies = broken
        response = client.get("/ui/")
        assert response.status_code == status and response.headers["content-type"].startswith("text/html")
        assert shown in response.text and "a bug of ours" not in response.text
        api = client.get("/v1/status")
        assert api.status_code == status and api.headers["content-type"] == "application/problem+json"
