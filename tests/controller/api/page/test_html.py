"""The HTML builder escapes every string unless it is Markup it made itself."""

from __future__ import annotations

from controller.api.page.html import Markup, el, esc, join


def test_text_and_attributes_are_escaped() -> None:
    out = el("td", '<b>"x" & y</b>', title='a"b<c>', data_field="x")
    assert out == '<td title="a&quot;b&lt;c&gt;" data-field="x">&lt;b&gt;"x" &amp; y&lt;/b&gt;</td>'


def test_markup_passes_nested_children_flatten_and_none_is_dropped() -> None:
    inner = el("b", "<i>")
    assert el("p", inner, None, ["a", ("b", 3)], 1.5) == "<p><b>&lt;i&gt;</b>ab31.5</p>"
    assert isinstance(inner, Markup) and esc(inner) is inner
    assert esc("<") == "&lt;"


def test_attribute_names_and_flags() -> None:
    assert el("input", type="search", required=True, hidden=False, class_="c", aria_label="l") == (
        '<input type="search" required class="c" aria-label="l">'
    )
    assert el("path", d="M0 0") == '<path d="M0 0"/>'


def test_join_escapes_its_separator_and_children() -> None:
    assert join(["<a>", el("b", "x")], " & ") == "&lt;a&gt; &amp; <b>x</b>"
