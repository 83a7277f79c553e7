"""contracts.urls: the one http(s) base-URL check."""

from __future__ import annotations

import pytest

from contracts.urls import base_url_problem, http_url, http_url_problem, redacted_url


@pytest.mark.parametrize("url", ["http://127.0.0.1:9090", "https://prometheus.example", "http://alerts:8080/page?x=1"])
def test_http_urls_with_a_host_pass(url: str) -> None:
    assert http_url_problem("prometheus_url", url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [("notaurl", "is not an http(s) URL"), ("ftp://127.0.0.1/", "is not an http(s) URL"),
     ("http://", "is not an http(s) URL"), ("http://[::1", "is not a URL"),
     ("http://127.0.0.1:99999", "is not a URL"), ("http://127.0.0.1:abc", "is not a URL"),
     ("http://:8000", "has no host"), ("http://h:0", "port 0")],
)
def test_other_text_is_named(url: str, says: str) -> None:
    problem = http_url_problem("--url", url)
    assert problem is not None and problem.startswith(f"--url: {url!r} ") and says in problem


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://replica.example/", "http://[::1]:80"])
def test_base_urls_are_a_host_and_port_alone(url: str) -> None:
    assert base_url_problem("replicas", url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [("http://127.0.0.1:8000/v1", "no path"), ("http://h:1/?x=1", "no path"), ("http://h:1#top", "no path"),
     ("http://h:abc", "is not a URL"), ("ftp://h:1", "is not an http(s) URL")],
)
def test_a_base_url_with_more_is_named(url: str, says: str) -> None:
    problem = base_url_problem("replicas", url)
    assert problem is not None and problem.startswith(f"replicas: {url!r} ") and says in problem


def test_a_server_url_puts_an_ipv6_host_in_brackets() -> None:
    """``--host ::`` printed ``http://:::8080/ui/``, a URL no browser opens."""
    assert http_url("::", 8080) == "http://[::]:8080"
    assert http_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("url", "shown"),
    [("http://moeslo:s3cr3t@127.0.0.1:9", "http://***@127.0.0.1:9"),
     ("https://ops:p%40ss@am.example:9093/base?x=1", "https://***@am.example:9093/base?x=1"),
     ("http://user@h/a@b", "http://***@h/a@b"), ("http://a:b@c@h:1#f", "http://***@h:1#f"),
     ("http://127.0.0.1:9090/a@b", "http://127.0.0.1:9090/a@b"), ("notaurl", "notaurl"),
     ("admin:s3cr3t@prom:9090", "***@prom:9090"), ("http://user:pa/ss@h", "http://***@h")],
)
def test_a_url_is_shown_without_its_user_and_password(url: str, shown: str) -> None:
    """httpx sends a URL's ``user:password@`` as basic auth; no message may repeat it."""
    assert redacted_url(url) == shown


@pytest.mark.parametrize("url", ["http://moeslo:s3cr3t@127.0.0.1:99999", "ftp://moeslo:s3cr3t@h/",
                                 "http://moeslo:s3cr3t@:80", "http://moeslo:s3cr3t@h:0"])
def test_a_refused_url_is_named_without_its_password(url: str) -> None:
    for problem in (http_url_problem("prometheus_url", url), base_url_problem("replicas", url)):
        assert problem is not None and "s3cr3t" not in problem and "***@" in problem
    assert "s3cr3t" not in str(base_url_problem("replicas", "http://moeslo:s3cr3t@h:1/v1"))


def test_an_endpoint_refused_for_its_credentials_is_named_without_them() -> None:
    """The refusal of credentials in an engine endpoint (a policy's 422, the controller's config error) printed
    them; so did the errors of a URL with no scheme or a password with a "/" in it."""
    from controller.endpoints import check_endpoint_url

    with pytest.raises(ValueError, match="must not carry credentials") as refused:
        check_endpoint_url("http://admin:s3cr3t@10.0.0.1:8000")
    assert "s3cr3t" not in str(refused.value)
    for url in ("admin:s3cr3t@prom:9090", "http://user:s3/cr3t@h"):
        problem = http_url_problem("prometheus_url", url)
        assert problem is not None and "s3cr3t" not in problem and "cr3t" not in problem


def test_a_replica_url_with_credentials_is_refused_without_repeating_them() -> None:
    """The router named a replica by its URL in answers to any client and in its series' labels: a password there
    went everywhere.  Replicas, like the controller's endpoints, take none."""
    problem = base_url_problem("replicas", "http://admin:s3cr3t@127.0.0.1:8000")
    assert problem is not None and "must not carry credentials" in problem and "s3cr3t" not in problem
