"""A small client of the controller's REST API (what ``moeslo policy ...`` uses).

Problem documents come back as moeslo errors carrying the server's message:
404 -> NotFoundError, 409/412 -> ConflictError, 400/422 -> ValidationError,
5xx and connection failures -> UnavailableError.
"""

from __future__ import annotations

from typing import Any

import httpx

from contracts.errors import ConflictError, DataError, MoesloError, NotFoundError, UnavailableError, ValidationError

TIMEOUT_S = 30.0


def request(method: str, url: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
    """One API call; raises the moeslo error that matches a 4xx/5xx answer.

    A write the controller refuses for want of ``If-Match`` (428: it runs with ``require_if_match``) is sent
    once more over the version read just before, so a stale version is still refused (412), never overwritten.
    """
    headers = dict(kwargs.pop("headers", {}))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    response = _send(method, url, headers, **kwargs)
    if response.status_code == 428 and "If-Match" not in headers:
        etag = _send("GET", url, headers).headers.get("etag")
        if etag:
            response = _send(method, url, {**headers, "If-Match": etag}, **kwargs)
    if response.status_code >= 400:
        raise _error(response, url)
    return response


def _send(method: str, url: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response:
    try:
        return httpx.request(method, url, headers=headers, timeout=TIMEOUT_S, **kwargs)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"controller at {url}: {exc}") from exc


def answer(response: httpx.Response, *keys: str) -> Any:
    """The JSON body of a 2xx answer, which must be an object with ``keys`` (DataError otherwise: the URL is
    not a moeslo controller's, or not the API path meant)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    missing = [k for k in keys if not isinstance(body, dict) or k not in body]
    if body is None or missing:
        what = f"no {', '.join(repr(k) for k in missing)}" if body is not None else "not JSON"
        raise DataError(f"the answer of {response.request.url} is not a moeslo controller's ({what})")
    return body


def _error(response: httpx.Response, url: str) -> MoesloError:
    try:
        body = response.json()
    except ValueError:
        body = None
    # A proxy's or gateway's JSON need not be a problem document: a list, a string, null are shown as sent.
    detail = body.get("detail", response.text) if isinstance(body, dict) else response.text
    status = response.status_code
    if status == 404:
        found = NotFoundError("resource", url.rstrip("/").rsplit("/", 1)[-1] + f" (at {url})")
        if isinstance(detail, str) and detail and detail != "Not Found":  # the controller's own words
            found.args = (detail,)
        return found
    error: type[MoesloError] = MoesloError
    if status in (409, 412):
        error = ConflictError
    elif status in (400, 422):
        error = ValidationError
    elif status >= 500:
        error = UnavailableError
    return error(f"HTTP {status}: {detail}")


__all__ = ["TIMEOUT_S", "answer", "request"]
