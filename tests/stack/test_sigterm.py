"""SIGTERM ends a run as Ctrl-C does: its ``finally`` stops what it started."""

from __future__ import annotations

import os
import signal

import pytest

from stack.shutdown import stop_on_sigterm


def test_sigterm_raises_system_exit_and_the_handler_is_restorable() -> None:
    previous = stop_on_sigterm()
    try:
        with pytest.raises(SystemExit) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)  # let the handler run before leaving the block
        assert stopped.value.code == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) == previous
