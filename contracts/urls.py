"""One check for the base URLs a user gives (Prometheus, Alertmanager, webhooks, engines, Grafana), the URL a
server of ours prints for itself, and the form of a user's URL fit to show (no password)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["base_url_problem", "http_url", "http_url_problem", "redacted_url"]


def http_url_problem(name: str, url: str) -> str | None:
    """None when ``url`` is an http(s) URL with a host (and a port, if any, that can be connected to); otherwise
    what is wrong with it, under ``name``.

    Policy endpoints, which the controller itself calls, take the stricter
    :func:`controller.endpoints.check_endpoint_url`.
    """
    shown = redacted_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:  # urlsplit's own words may quote a part of the password
        return f"{name}: {shown!r} is not a URL" + ("" if shown != url else f" ({exc})")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{name}: {shown!r} is not an http(s) URL"
    if not parts.hostname:
        return f"{name}: {shown!r} has no host"
    if port == 0:
        return f"{name}: {shown!r} has port 0"
    return None


def redacted_url(url: str) -> str:
    """``url`` with its user and password, if any, as ``***``: fit for an error, a page or a log line.

    A ``user:password@`` in a Prometheus or Alertmanager URL is accepted (httpx sends it as basic auth), so every
    message that names such a URL names this form of it.
    """
    # By hand, not urlsplit: a URL it refuses (a bad port, a password with a "/") may still carry a password.
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0] if sep else ""
    if "@" in authority:
        return f"{scheme}://***@{authority.rpartition('@')[2]}{rest[len(authority):]}"
    if sep and _parses(url):
        return url  # an "@" past the host is the path's or the query's
    # No scheme, or one urlsplit cannot read: the last "@" before a query or fragment may end a user's info (a
    # password with a "/" in it): hiding a host costs less than showing a password.
    text = rest if sep else url
    end = next((i for i, char in enumerate(text) if char in "?#"), len(text))
    at = text.rfind("@", 0, end)
    return url if at < 0 else (f"{scheme}://" if sep else "") + f"***@{text[at + 1:]}"


def _parses(url: str) -> bool:
    try:
        urlsplit(url).port  # noqa: B018  (raises on a port that is no number)
    except ValueError:
        return False
    return True


def base_url_problem(name: str, url: str) -> str | None:
    """As :func:`http_url_problem`, and nothing after the host and port: the URL of a server its caller adds
    its own paths to (a replica's ``/v1/completions``, ``/metrics``, ``/health``), where a path such as the
    OpenAI base URL's ``/v1`` would be doubled."""
    if (problem := http_url_problem(name, url)) is not None:
        return problem
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:  # it would name the replica in answers and series
        return f"{name}: {redacted_url(url)!r} must not carry credentials"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return (f"{name}: {redacted_url(url)!r} must be http(s)://host:port alone "
                "(no path such as /v1, no query or fragment)")
    return None


def http_url(host: str, port: int) -> str:
    """The base URL of a server listening on ``host``: an IPv6 address in brackets (``http://[::1]:8080``)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
