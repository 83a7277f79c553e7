"""The one-command local stack (``moeslo up``): engine, controller, Prometheus, Alertmanager, load."""

from __future__ import annotations

from cli.stack.run import StackOptions, run_stack

__all__ = ["StackOptions", "run_stack"]
