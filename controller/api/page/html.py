"""A tiny HTML builder that escapes by default.

Every ``str`` child and attribute value is escaped; only :class:`Markup`
(what this module itself produced) passes through as is.  So a policy name,
description or decision detail can never open a tag, whatever it holds::

    el("td", policy.description, class_="desc")   # <td class="desc">&lt;b&gt;...</td>
"""

from __future__ import annotations

import html
from collections.abc import Iterable

__all__ = ["AttrValue", "Child", "Markup", "el", "esc", "join"]


class Markup(str):
    """Text that is already safe HTML (built by :func:`el` or :func:`esc`)."""

    __slots__ = ()


Child = Markup | str | int | float | None | Iterable["Child"]
AttrValue = str | int | float | bool | None

_VOID = frozenset({"br", "circle", "hr", "img", "input", "line", "link", "meta", "path", "polyline", "rect", "stop"})


def esc(value: object) -> Markup:
    """``value`` as text: ``<``, ``>``, ``&`` and both quotes escaped (Markup passes unchanged)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def _attr_name(name: str) -> str:
    # class_ -> class, data_series -> data-series, aria_label -> aria-label
    return name.rstrip("_").replace("_", "-")


def _render(child: Child, out: list[str]) -> None:
    if child is None:
        return
    if isinstance(child, Markup):
        out.append(child)
    elif isinstance(child, str):
        out.append(html.escape(child, quote=False))
    elif isinstance(child, int | float):
        out.append(str(child))
    else:
        for item in child:
            _render(item, out)


def el(tag: str, *children: Child, **attrs: AttrValue) -> Markup:
    """``<tag attrs>children</tag>``; attributes that are None or False are left out, True ones are bare."""
    parts = [f"<{tag}"]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f" {_attr_name(name)}")
        else:
            parts.append(f' {_attr_name(name)}="{html.escape(str(value), quote=True)}"')
    if tag in _VOID and not children:
        parts.append("/>" if tag not in {"br", "hr", "img", "input", "link", "meta"} else ">")
        return Markup("".join(parts))
    parts.append(">")
    _render(children, parts)
    parts.append(f"</{tag}>")
    return Markup("".join(parts))


def join(children: Iterable[Child], separator: str = "") -> Markup:
    """Children rendered one after another (``separator``, escaped, between them)."""
    out: list[str] = []
    sep = html.escape(separator, quote=False)
    for i, child in enumerate(children):
        if i and sep:
            out.append(sep)
        _render(child, out)
    return Markup("".join(out))
