"""contracts.urls: the one http(s) base-URL check."""

from __future__ import annotations

import pytest

from contracts.urls import http_url_problem


@pytest.mark.parametrize("url", ["http://127.0.0.1:9090", "https://prometheus.example", "http://alerts:8080/page?x=1"])
def test_http_urls_with_a_host_pass(url: str) -> None:
    assert http_url_problem("prometheus_url", url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [("notaurl", "is not an http(s) URL"), ("ftp://127.0.0.1/", "is not an http(s) URL"),
     ("http://", "is not an http(s) URL"), ("http://[::1", "is not a URL")],
)
def test_other_text_is_named(url: str, says: str) -> None:
    problem = http_url_problem("--url", url)
    assert problem is not None and problem.startswith(f"--url: {url!r} ") and says in problem
