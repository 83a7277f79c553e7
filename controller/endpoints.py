"""Engine endpoints that users hand the controller: their form, and which addresses the configuration allows.

A policy's endpoints are URLs the controller will fetch, so a policy written
over REST could point it at this host's own services, at link-local
neighbours or at a cloud metadata service.  :func:`check_endpoint_url` keeps
the form to plain ``http``/``https`` base URLs (no credentials, query or
control characters); :func:`address_class` names the special address
classes, which the API refuses unless the controller's configuration lists
them in ``allowed_endpoint_addresses`` (``moeslo up`` allows ``loopback``:
its engines listen on 127.0.0.1).

Only literal addresses and well-known names are classified (``localhost``,
``127.1``, ``[::ffff:127.0.0.1]``, ``metadata.google.internal``); host names
are not resolved, so a name that resolves to such an address is for the
network policy to stop.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Literal
from urllib.parse import urlsplit

from contracts.urls import redacted_url

AddressClass = Literal["loopback", "link-local", "metadata"]
ADDRESS_CLASSES: tuple[AddressClass, ...] = ("loopback", "link-local", "metadata")
MAX_URL_LENGTH = 2048

_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"})
_METADATA_ADDRESSES = frozenset({
    ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("169.254.170.2"),
    ipaddress.ip_address("100.100.100.200"), ipaddress.ip_address("fd00:ec2::254"),
})  # fmt: skip
_NUMERIC_HOST = re.compile(r"^[0-9a-fx.]+$")


def check_endpoint_url(url: str) -> str:
    """``url`` if it is an http(s) base URL with a host; ValueError naming what is wrong otherwise."""
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"endpoint is longer than {MAX_URL_LENGTH} characters")
    if _CONTROL.search(url):
        raise ValueError("endpoint must not contain spaces or control characters")
    shown = redacted_url(url)  # every message below: one refusing credentials must not repeat them
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"endpoint {shown!r} is not a valid URL" + ("" if shown != url else f" ({exc})")) from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {shown!r} must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError(f"endpoint {shown!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"endpoint {shown!r} must not carry credentials")
    if parts.query or parts.fragment:
        raise ValueError(f"endpoint {shown!r} must be a base URL (no query or fragment)")
    if port == 0:
        raise ValueError(f"endpoint {shown!r} has port 0")
    return url


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not _NUMERIC_HOST.fullmatch(host):
            return None
        try:  # the forms inet_aton takes too, as HTTP clients do: 127.1, 0x7f.1, 2130706433
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_class(url: str) -> AddressClass | None:
    """The special address class of ``url``'s host (None: an ordinary address or name)."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host in _METADATA_NAMES:
        return "metadata"
    if host == "localhost" or host.endswith(".localhost"):
        return "loopback"
    ip = _ip(host)
    if ip is None:
        return None
    if ip in _METADATA_ADDRESSES:
        return "metadata"
    if ip.is_loopback or ip.is_unspecified:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    return None


def endpoint_problems(endpoints: Iterable[str], allowed: Iterable[str], *, field: str) -> list[str]:
    """One problem per endpoint whose address class the configuration does not allow."""
    allowed_set = set(allowed)
    problems = []
    for index, url in enumerate(endpoints):
        kind = address_class(url)
        if kind is not None and kind not in allowed_set:
            problems.append(f"{field}.{index}: {url!r} is a {kind} address, which this controller does not allow "
                            f"(its config's allowed_endpoint_addresses)")
    return problems


__all__ = ["ADDRESS_CLASSES", "AddressClass", "address_class", "check_endpoint_url", "endpoint_problems"]
