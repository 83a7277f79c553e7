"""run_to_end: work a cancellation must not cut in half finishes first (or within a grace), and the cancellation
still comes."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.tasks import run_to_end


async def _steps(done: list[str], *, fail: bool = False) -> str:
    done.append("applied")
    await asyncio.sleep(0.05)
    if fail:
        raise RuntimeError("the record could not be written")
    done.append("recorded")
    return "ok"


def test_uncancelled_it_returns_the_result_or_raises_the_error() -> None:
    assert asyncio.run(run_to_end(_steps([]))) == "ok"
    with pytest.raises(RuntimeError, match="could not be written"):
        asyncio.run(run_to_end(_steps([], fail=True)))


@pytest.mark.parametrize("fail", [False, True])
def test_a_cancellation_waits_for_the_work_and_is_raised_after_it(fail: bool) -> None:
    done: list[str] = []

    async def run() -> bool:
        task = asyncio.create_task(run_to_end(_steps(done, fail=fail)))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # a second one waits too
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert asyncio.run(run()) is True
    assert done == (["applied"] if fail else ["applied", "recorded"])


async def _slow_steps(done: list[str], take_s: float) -> str:
    done.append("applying")
    try:
        await asyncio.sleep(take_s)
    except asyncio.CancelledError:
        done.append("recorded as cut short")
        raise
    done.append("applied")
    return "ok"


def _cancelled_after_a_grace(done: list[str], take_s: float, grace_s: float) -> float:
    """Cancel ``run_to_end`` of work that takes ``take_s``, with ``grace_s``; the seconds it took to end."""

    async def run() -> float:
        task = asyncio.create_task(run_to_end(_slow_steps(done, take_s), grace_s=grace_s))
        await asyncio.sleep(0.01)
        started = time.monotonic()
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # a second one does not start the grace afresh
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    return asyncio.run(run())


def test_work_longer_than_the_grace_is_cut_short_when_it_runs_out() -> None:
    """A shutdown waited for an action as long as the action took (a vLLM rebalance: up to 300 s), past the pod's
    termination grace period; now the work is cancelled when the grace runs out and may record that."""
    done: list[str] = []
    took_s = _cancelled_after_a_grace(done, take_s=30.0, grace_s=0.1)
    assert 0.1 <= took_s < 1.5
    assert done == ["applying", "recorded as cut short"]


def test_work_that_ends_within_the_grace_runs_to_its_end() -> None:
    done: list[str] = []
    took_s = _cancelled_after_a_grace(done, take_s=0.05, grace_s=5.0)
    assert took_s < 1.5
    assert done == ["applying", "applied"]


def test_the_event_loop_is_favoured_over_worker_threads_and_the_old_interval_returned() -> None:
    import sys

    from controller.tasks import LOOP_SWITCH_INTERVAL_S, favour_the_event_loop

    sys.setswitchinterval(0.005)
    assert favour_the_event_loop() == pytest.approx(0.005)
    assert sys.getswitchinterval() == pytest.approx(LOOP_SWITCH_INTERVAL_S) and LOOP_SWITCH_INTERVAL_S < 0.005
