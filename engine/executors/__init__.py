"""Model executors: the interface the scheduler drives, and where the expert MLPs run.

- :mod:`engine.executors.options`: ``ExecutorOptions``, the ``Executor`` protocol and the
  default thread count (no torch: the API process names them);
- :mod:`engine.executors.base`: the rank-0 driver every executor builds on;
- :mod:`engine.executors.local`: one process (``--ep 1``, or ``--ep N --colocate-ranks``);
- :mod:`engine.executors.multiproc`: N rank processes in a torch.distributed group (``--ep N``).

:func:`create_executor` starts the one ``ExecutorOptions.ep`` asks for.
"""

from __future__ import annotations

from contracts.errors import ValidationError
from engine.executors.options import Executor, ExecutorOptions


def create_executor(options: ExecutorOptions) -> Executor:
    """Start the executor that ``options.ep`` asks for."""
    if options.ep < 1:
        raise ValidationError(f"ep must be >= 1, got {options.ep}")
    if options.ep == 1 or options.colocate_ranks:
        from engine.executors.local import LocalExecutor

        return LocalExecutor(options)
    from engine.executors.multiproc import MultiprocExecutor

    return MultiprocExecutor(options)


__all__ = ["Executor", "ExecutorOptions", "create_executor"]
