"""The one-command local stack behind ``moeslo up``: engine, controller, Prometheus, Alertmanager, load.

``run`` starts the processes and drives the load, ``state`` is what it records,
``report`` writes the summary and plots, ``view`` draws the live terminal view.
"""

from __future__ import annotations

from stack.run import run_stack
from stack.state import StackOptions

__all__ = ["StackOptions", "run_stack"]
