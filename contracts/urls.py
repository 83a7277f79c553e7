"""One check for the base URLs a user gives (Prometheus, Alertmanager, webhooks, engines, Grafana)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["http_url_problem"]


def http_url_problem(name: str, url: str) -> str | None:
    """None when ``url`` is an http(s) URL with a host; otherwise what is wrong with it, under ``name``.

    Policy endpoints, which the controller itself calls, take the stricter
    :func:`controller.endpoints.check_endpoint_url`.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"{name}: {url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{name}: {url!r} is not an http(s) URL"
    return None
