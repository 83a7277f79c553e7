"""Process helpers: a free port, waiting on a process that answers or dies, stopping it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.errors import UnavailableError
from harness.processes import free_port, log_tail, start_process, stop_process, wait_healthy
from harness.traces import BUNDLED_CONVERSATION_SLICE
from tests.harness.children import gone, kill_quietly, still_running

ROOT = Path(__file__).resolve().parents[2]
_TWO_CHILDREN = ("import sys, time\n"
                 "from harness.processes import start_process\n"
                 "for die in (True, False):\n"
                 "    child = start_process([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
                 "                          die_with_parent=die)\n"
                 "    print(child.pid, flush=True)\n"
                 "time.sleep(60)\n")
"""A parent with one child that dies with it and one that does not."""


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname()[1] == port


def test_wait_healthy_reports_a_process_that_exits_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    proc = start_process([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log_path=log)
    with pytest.raises(UnavailableError, match="child exited with 3") as info:
        wait_healthy(f"http://127.0.0.1:{free_port()}/health", proc, 30.0, name="child", log_path=log)
    assert "boom" in str(info.value)
    assert "boom" in log_tail(log)


def test_wait_healthy_answers_once_the_server_does(tmp_path: Path) -> None:
    port = free_port()
    proc = start_process([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                         log_path=tmp_path / "http.log", cwd=tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/", proc, 30.0, name="http.server", log_path=tmp_path / "http.log")
        assert proc.poll() is None
    finally:
        stop_process(proc, 5.0)
    assert proc.poll() is not None


def test_stop_process_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    log = tmp_path / "stubborn.log"
    proc = start_process([sys.executable, "-c", code], log_path=log)
    deadline = time.monotonic() + 30
    while "ready" not in log_tail(log):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    stop_process(proc, 0.5)
    assert proc.returncode is not None and proc.returncode < 0


def test_the_bundled_trace_slice_ships_with_its_license() -> None:
    assert BUNDLED_CONVERSATION_SLICE.is_file()
    assert "CC BY 4.0" in (BUNDLED_CONVERSATION_SLICE.parent / "README.md").read_text()


class _SlowToDie(subprocess.Popen[bytes]):
    """A real process whose teardown after SIGKILL outlasts the wait (a teardown stuck in the kernel): it reads as
    running, and every wait with a timeout times out."""

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return super().wait()


def test_stop_process_logs_a_process_still_not_gone_after_sigkill_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """terminate, wait, kill, wait: the second wait's TimeoutExpired escaped, cutting short whatever stop came
    after it (the other processes of a run)."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    proc = _SlowToDie([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # SIGTERM is ignored from here on
    try:
        stop_process(proc, 0.1)
        returncode = subprocess.Popen.wait(proc, 10)
    finally:
        if subprocess.Popen.poll(proc) is None:
            proc.kill()
            subprocess.Popen.wait(proc, 10)
        proc.stdout.close()
    assert returncode == -signal.SIGKILL, "the kill was sent"
    assert f"process {proc.pid} is not gone 10 s after SIGKILL; left to exit" in caplog.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_to_die_with_its_parent_does_not_outlive_a_sigkilled_parent() -> None:
    """Children run in sessions of their own: a parent killed with SIGKILL (or by the OOM killer) left them running."""
    parent = subprocess.Popen([sys.executable, "-c", _TWO_CHILDREN], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert parent.stdout is not None
    lines = [parent.stdout.readline().strip() for _ in range(2)]
    parent.kill()
    parent.wait(10)
    parent.stdout.close()
    assert all(lines), "the parent did not start its two children"
    dying, staying = (int(line) for line in lines)
    try:
        left, stayed = still_running([dying]), not gone(staying)
    finally:
        kill_quietly([dying, staying])
    assert left == [], "the child started with die_with_parent outlived its parent"
    assert stayed, "a child started without die_with_parent outlives its parent (what the option is for)"


_LEADER_AND_WORKER = (
    "import subprocess, sys\n"
    "worker = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)'])\n"
    "print(worker.pid, flush=True)\n"
    "sys.exit(int(sys.argv[1]))\n"
)
"""A group leader that starts a worker ignoring SIGTERM, prints its pid and exits (a crashed API server)."""


@pytest.mark.parametrize("leader_exits", [True, False], ids=["leader-gone-first", "leader-on-sigterm"])
def test_stop_process_stops_the_whole_group_whatever_its_leader_did(leader_exits: bool) -> None:
    """With the leader gone (crashed, or left on SIGTERM) the rest of its group was never signalled."""
    script = _LEADER_AND_WORKER if leader_exits else _LEADER_AND_WORKER.replace("sys.exit(int(sys.argv[1]))\n",
                                                                              "import time; time.sleep(60)\n")
    leader = subprocess.Popen([sys.executable, "-c", script, "1"], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    worker = int(leader.stdout.readline())
    assert leader.stdout.readline() == b"\n"  # the worker ignores SIGTERM from here on
    try:
        if leader_exits:
            leader.wait(10)
        stop_process(leader, 0.5, group=True)
        assert not still_running([worker], 5.0), "the worker outlived the stop of its group"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.stdout.close()

