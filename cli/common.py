"""Shared pieces of the command line: the console, JSON output, the error exit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console

from contracts.errors import MoesloError

console = Console(stderr=True)
"""Human-readable progress and messages go to stderr, so stdout stays parseable."""


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    tolist: Callable[[], Any] | None = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dim(text: str) -> None:
    """A progress line on the console (the benchmarks' and the stack's progress callback)."""
    console.print(f"[dim]{text}[/]")


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a MoesloError into a one-line message and exit status 2."""
    try:
        yield
    except MoesloError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from exc
