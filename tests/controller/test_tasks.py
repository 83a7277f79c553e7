"""run_to_end: work a cancellation must not cut in half finishes first, and the cancellation still comes."""

from __future__ import annotations

import asyncio

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
