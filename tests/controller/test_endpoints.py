"""Endpoints users hand the controller: the URL form, and the special address classes."""

from __future__ import annotations

import pytest

from controller.endpoints import address_class, check_endpoint_url, endpoint_problems


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("file:///etc/passwd", "http:// or https://"),
        ("gopher://example.org/", "http:// or https://"),
        ("http://", "no host"),
        ("http://user:pw@example.org", "credentials"),
        ("http://example.org/?q=1", "no query"),
        ("http://exa mple.org", "control characters"),
        ("http://example.org\x00", "control characters"),
        ("http://example.org:99999", "not a valid URL"),
        ("http://" + "a" * 3000, "longer than"),
    ],
)
def test_malformed_endpoints_are_refused(url: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_endpoint_url(url)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000", "loopback"),
        ("http://127.1:8000", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://[::1]:8000", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://localhost:8000", "loopback"),
        ("http://LOCALHOST./", "loopback"),
        ("http://0.0.0.0:8000", "loopback"),
        ("http://169.254.169.254/", "metadata"),
        ("http://metadata.google.internal/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://169.254.10.10/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://10.0.0.5:8000", None),
        ("https://engine.prod.svc:8000", None),
    ],
)
def test_special_addresses_are_classified(url: str, kind: str | None) -> None:
    assert address_class(check_endpoint_url(url)) == kind


def test_only_the_allowed_classes_pass() -> None:
    urls = ["http://127.0.0.1:1", "http://169.254.169.254/", "http://10.0.0.1:1"]
    assert [p.split(":")[0] for p in endpoint_problems(urls, (), field="e")] == ["e.0", "e.1"]
    assert [p.split(":")[0] for p in endpoint_problems(urls, ("loopback",), field="e")] == ["e.1"]
    assert endpoint_problems(urls, ("loopback", "metadata"), field="e") == []
