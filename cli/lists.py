"""Options that take comma-separated numbers (``--replicas 8,10,12``, ``--rates 0.5,1,2``), read by their name."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from contracts.errors import ValidationError

T = TypeVar("T", int, float)


def integers(flag: str, text: str) -> list[int]:
    """The integers of ``text`` (empty items skipped); one that is not refused as ``flag``'s."""
    return _items(flag, text, int, "an integer")


def numbers(flag: str, text: str) -> list[float]:
    """The finite numbers of ``text`` (empty items skipped); ``inf``, ``nan`` and words refused as ``flag``'s."""

    def finite(item: str) -> float:
        value = float(item)
        if not math.isfinite(value):
            raise ValueError(item)
        return value

    return _items(flag, text, finite, "a finite number")


def _items(flag: str, text: str, convert: Callable[[str], T], kind: str) -> list[T]:
    values, problems = [], []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            values.append(convert(item))
        except ValueError:
            problems.append(f"{flag}: {item!r} is not {kind}")
    if problems:
        raise ValidationError(problems)
    return values


__all__ = ["integers", "numbers"]
