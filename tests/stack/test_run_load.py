"""``moeslo up``'s load phase (:meth:`stack.run.LocalStack.run_load`) with its processes stubbed: what an
interrupted load and a fault cut short leave in the summary."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import stack.load
import stack.plots
import stack.run
from harness.loadgen import LoadRequest, RequestRecord
from stack.load import UNFINISHED_ERROR
from stack.report import request_rows, summarize
from stack.run import LocalStack, run_stack
from stack.shutdown import Interrupted
from stack.state import StackOptions

CLOSED = "http://127.0.0.1:9"
"""Nothing listens there: the sampler's looks get no answer at once."""


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import engine.config

    monkeypatch.setattr(engine.config.ModelConfig, "load", staticmethod(lambda _path: SimpleNamespace(vocab_size=100)))
    yield


def _stack(tmp_path: Path, **options: Any) -> LocalStack:
    local = LocalStack(StackOptions(out=tmp_path, router=False, sample_interval_s=0.2, **options))
    local.checkpoint = tmp_path
    local.state.engines = [CLOSED]
    local.state.controller_url = CLOSED
    return local


async def _cancelled_after(seconds: float, load: Any) -> None:
    """As Ctrl-C ends ``asyncio.run``: the main task is cancelled."""
    task = asyncio.create_task(load)
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _last_five_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten requests over a second: the first five answered at once, the last five slow (in a fault, say)."""
    plan = [LoadRequest(arrival_s=0.1 * i, prompt_tokens=4, max_tokens=4) for i in range(10)]
    monkeypatch.setattr(stack.run, "load_plan", lambda _options, _rate: (plan, "test plan"))

    async def send(_client: Any, req: LoadRequest, *_args: Any, **_kw: Any) -> RequestRecord:
        await asyncio.sleep(0.2 if req.arrival_s < 0.45 else 60.0)
        return RequestRecord(arrival_s=req.arrival_s, prompt_tokens=4, max_tokens=4, status=200, ttft_s=0.1,
                             itls_s=[0.01] * 3, output_tokens=4)

    monkeypatch.setattr(stack.load, "send_request", send)


def test_an_interrupted_load_counts_its_requests_in_flight_as_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None,
) -> None:
    """Ctrl-C during the load: the five requests still in flight were neither recorded nor counted
    (``unfinished_at_end: 0``; only a drain timeout counted them), and left out of the shares."""
    _last_five_slow(monkeypatch)
    local = _stack(tmp_path, duration_s=30.0, inject_slowdown=False)
    try:
        asyncio.run(_cancelled_after(2.0, local.run_load()))
    finally:
        local.stop()
    summary = summarize(local.state)
    # The five in flight are requests not served: in the counts, and in every share's denominator.
    assert (summary["requests"], summary["ok"], summary["failed"], summary["unfinished_at_end"]) == (10, 5, 5, 5)
    assert summary["requests_within_both_slos_outside_fault"] == pytest.approx(0.5)
    assert any("5 requests still in flight" in line for line in summary["events"]), summary["events"]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="sets signal handlers")
@pytest.mark.parametrize(("sig", "raised"), [(signal.SIGTERM, SystemExit), (signal.SIGINT, Interrupted)],
                         ids=["sigterm", "ctrl-c"])
def test_a_signal_during_the_load_counts_its_requests_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None, sig: signal.Signals, raised: type[BaseException],
) -> None:
    """SIGTERM (``kill``, a CI timeout) during the load ends it as Ctrl-C does.  Its handler raised in the middle of
    the event loop, asyncio then cancelled every task at once, and the load's ``finally`` found the five requests
    in flight already recorded as unfinished: ``unfinished_at_end: 0`` beside five unfinished rows in requests.csv,
    no line saying they were stopped, and the sampler's and CPU pool's ends skipped."""
    _last_five_slow(monkeypatch)

    def start(self: LocalStack, _progress: Any) -> None:
        self.checkpoint = tmp_path
        self.state.engines = [CLOSED]
        self.state.controller_url = CLOSED

    monkeypatch.setattr(LocalStack, "start", start)
    monkeypatch.setattr(stack.plots, "write_plots", lambda _state, _out: [])
    options = StackOptions(out=tmp_path, router=False, prometheus=False, sample_interval_s=0.2, duration_s=30.0,
                           inject_slowdown=False)
    sender = threading.Timer(2.0, os.kill, (os.getpid(), sig))
    sender.start()
    try:
        with pytest.raises(raised) as stopped:
            run_stack(options)
    finally:
        sender.join()
    if sig == signal.SIGTERM:
        assert stopped.value.args == (128 + signal.SIGTERM,)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert (summary["requests"], summary["ok"], summary["failed"], summary["unfinished_at_end"]) == (10, 5, 5, 5)
    assert any("stopped 5 requests still in flight when the load was stopped" in line
               for line in summary["events"]), summary["events"]
    with (tmp_path / "requests.csv").open() as rows:
        assert sum(row["error"] == UNFINISHED_ERROR for row in csv.DictReader(rows)) == 5


def test_requests_past_the_drain_are_counted_as_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None,
) -> None:
    plan = [LoadRequest(arrival_s=0.0, prompt_tokens=4, max_tokens=4), LoadRequest(arrival_s=0.1, prompt_tokens=4,
                                                                                    max_tokens=4)]  # fmt: skip
    monkeypatch.setattr(stack.run, "load_plan", lambda _options, _rate: (plan, "test plan"))
    monkeypatch.setattr(stack.run, "DRAIN_S", 1.0)

    async def send(*_args: Any, **_kw: Any) -> RequestRecord:
        await asyncio.sleep(60.0)
        raise AssertionError("cancelled before")

    monkeypatch.setattr(stack.load, "send_request", send)
    local = _stack(tmp_path, duration_s=0.5, inject_slowdown=False)
    try:
        asyncio.run(local.run_load())
    finally:
        local.stop()
    summary = summarize(local.state)
    assert (summary["requests"], summary["failed"], summary["unfinished_at_end"]) == (2, 2, 2)
    assert summary["requests_within_both_slos"] == 0.0
    assert {row["error"] for row in request_rows(local.state)} == {UNFINISHED_ERROR}
    assert any("stopped 2 requests still in flight 1 s after the last arrival" in line
               for line in summary["events"]), summary["events"]


def _answered_after(monkeypatch: pytest.MonkeyPatch, arrivals: tuple[float, ...], seconds: float) -> None:
    """A plan of these arrivals, each request answered (within both objectives) ``seconds`` after it is sent."""
    plan = [LoadRequest(arrival_s=a, prompt_tokens=4, max_tokens=4) for a in arrivals]
    monkeypatch.setattr(stack.run, "load_plan", lambda _options, _rate: (plan, "test plan"))

    async def send(_client: Any, req: LoadRequest, *_args: Any, **_kw: Any) -> RequestRecord:
        await asyncio.sleep(seconds)
        return RequestRecord(arrival_s=req.arrival_s, prompt_tokens=4, max_tokens=4, status=200, ttft_s=0.1,
                             itls_s=[0.01] * 3, output_tokens=4)

    monkeypatch.setattr(stack.load, "send_request", send)


def _summary_of_load(local: LocalStack) -> dict[str, Any]:
    try:
        asyncio.run(local.run_load())
    finally:
        local.stop()
    return summarize(local.state)


def test_a_fault_cut_short_by_the_end_of_the_load_is_reported_as_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None,
) -> None:
    """The load ends (its last request answered) 0.7 s into a 5 s fault: the fault stops with it, and the summary
    said it lasted the 5 s planned (``fault_window_s`` and the plot's shading)."""
    _answered_after(monkeypatch, (0.0, 0.8), 0.1)
    summary = _summary_of_load(_stack(tmp_path, duration_s=1.0, slowdown_at_s=0.2, slowdown_for_s=5.0))
    start, end = summary["fault_window_s"]
    assert start == pytest.approx(0.2, abs=0.15) and end == pytest.approx(0.9, abs=0.3)
    assert any(re.search(r"fault cut short after 0\.\d s of its 5 s", line) for line in summary["events"])
    assert not any("fault over" in line for line in summary["events"])


def test_a_page_delivered_after_the_last_look_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None,
) -> None:
    """The sampler's looks end with the load; a page Alertmanager delivered after the last one was never read."""
    import httpx

    from harness.webhook import WebhookReceiver

    plan = [LoadRequest(arrival_s=0.0, prompt_tokens=4, max_tokens=4)]
    monkeypatch.setattr(stack.run, "load_plan", lambda _options, _rate: (plan, "test plan"))

    async def send(_client: Any, req: LoadRequest, *_args: Any, **_kw: Any) -> RequestRecord:
        return RequestRecord(arrival_s=req.arrival_s, prompt_tokens=4, max_tokens=4, status=200, ttft_s=0.1,
                             itls_s=[0.01] * 3, output_tokens=4)

    monkeypatch.setattr(stack.load, "send_request", send)
    local = _stack(tmp_path, duration_s=0.2, inject_slowdown=False)
    local.pager = pager = WebhookReceiver()
    try:
        asyncio.run(local.run_load())
        httpx.post(f"{pager.url}/page", json={"status": "firing", "alerts": [{"labels": {"alertname": "Burn"}}]})
    finally:
        local.stop()
    summary = local.write_results()
    assert summary["pages_delivered"] == 1 and summary["pages"][0]["alerts"] == ["Burn"]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="sets signal handlers")
def test_ctrl_c_while_the_results_are_written_keeps_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole run, and a Ctrl-C while the plot is drawn (seconds of matplotlib): every result file was lost, the
    summary and requests.csv being written after the plot, and none of it under the signals' deferral."""
    def start(self: LocalStack, _progress: Any) -> None:
        self.checkpoint = tmp_path

    async def run_load(self: LocalStack) -> None:
        self.state.records = [RequestRecord(arrival_s=0.0, prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.1,
                                            itls_s=[0.01] * 3, output_tokens=4)]
        self.state.done_at_s = [1.0]

    def write_plots(_state: Any, out: Path) -> list[Path]:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C lands while the plot is drawn
        signal.sigtimedwait([], 0.1)  # its handler runs here
        return [out / "moeslo-up.png"]

    monkeypatch.setattr(LocalStack, "start", start)
    monkeypatch.setattr(LocalStack, "run_load", run_load)
    monkeypatch.setattr(stack.plots, "write_plots", write_plots)
    try:
        summary = run_stack(StackOptions(out=tmp_path, prometheus=False, router=False))
    except KeyboardInterrupt:
        pytest.fail(f"the Ctrl-C cut the writing short; kept: {sorted(p.name for p in tmp_path.iterdir())}")
    assert summary["requests"] == 1 and summary["plots"] == [str(tmp_path / "moeslo-up.png")]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "requests.csv").read_text().count("\n") == 2


def test_no_fault_is_injected_when_it_is_planned_at_or_past_the_end_of_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubbed: None,
) -> None:
    """``--slowdown-at`` equal to ``--duration``: ``moeslo up`` said "no fault in this run", and the fault began in
    the drain all the same, throttling the requests still in flight and counting every one of them in it."""
    _answered_after(monkeypatch, (0.0, 0.3), 1.0)  # still in flight at the planned fault
    summary = _summary_of_load(_stack(tmp_path, duration_s=0.5, slowdown_at_s=0.5, slowdown_for_s=5.0))
    assert summary["fault_window_s"] is None and summary["requests_outside_fault"] == 2
    assert not any("fault" in line for line in summary["events"]), summary["events"]
