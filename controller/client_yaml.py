"""YAML a client sends, read so that its size bounds the work: aliases are refused as they are read, and a
refused value is shown cut short.

A few hundred bytes of nested aliases (``&a1 [*a0, *a0, ...]``) compose into gigabytes once anything walks
them (``str()``, ``repr()``, a validator); a plain structure as large as the request is a message as large.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

from contracts.errors import ValidationError


def shown(value: Any) -> str:
    """``value`` for a message, cut short: a refused field may hold a structure as large as the request."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxtuple, _SHOWN.maxset = 2, 4, 4, 4, 4
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = 60, 40, 60


class _AliasRefused(yaml.YAMLError):
    """A YAML alias (``*name``) in an import: a few hundred bytes of nested aliases are gigabytes once read."""

    def __init__(self, anchor: str, line: int, column: int) -> None:
        super().__init__(f"*{anchor} at line {line} column {column}")


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases before they are composed (an anchor alone is harmless)."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event: yaml.AliasEvent = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
            mark = event.start_mark
            raise _AliasRefused(str(event.anchor), mark.line + 1 if mark else 0, mark.column + 1 if mark else 0)
        return super().compose_node(parent, index)


def load_documents(text: str) -> list[Any]:
    """The YAML documents of an import (none empty), every failure to read them a :class:`ValidationError`."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_NoAliasLoader) if doc is not None]
    except _AliasRefused as exc:
        raise ValidationError(f"body: YAML aliases are not accepted ({exc}); write the value out") from exc
    except RecursionError as exc:
        raise ValidationError("body: YAML nested too deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 1}"
        raise ValidationError(f"body: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
