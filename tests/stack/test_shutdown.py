"""The end of ``moeslo up``: a second Ctrl-C does not cut the stop short, a dead controller is noticed and its
replicas do not outlive the run, nothing outlives a killed run, and the CLI says what is still running only after
looking."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stack.report import summarize
from stack.run import LocalStack
from stack.shutdown import Interrupted, stop_processes
from stack.state import StackOptions
from tests.harness.children import gone, kill_quietly, still_running

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")

SLOW_TO_STOP = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))\n"
                "print('ready', flush=True)\ntime.sleep(60)\n")
"""A stand-in for Prometheus or Alertmanager: a second to stop after SIGTERM."""
CONTROLLER = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
              "                         start_new_session=True)\n"
              "print('child', child.pid, flush=True)\ntime.sleep(60)\n")
"""A stand-in for the controller: one replica in a session of its own, as the local actuator starts it."""
KILLED_RUN = ("import sys, time\nfrom pathlib import Path\nfrom stack.services import Supervisor\n"
              "supervisor = Supervisor(Path(sys.argv[1]))\n"
              "for name, nice in (('prometheus', 10), ('controller', 0), ('router', 0)):\n"
              "    managed = supervisor.start(name, [sys.executable, '-c', 'import time; time.sleep(60)'], nice=nice)\n"
              "    print(managed.process.pid, flush=True)\n"
              "time.sleep(60)\n")
"""A stand-in for ``moeslo up``: Prometheus (under ``nice``), the controller and the router, as it starts them."""


def _wait_for(log: Path, word: str) -> str:
    deadline = time.monotonic() + 10
    while word not in (text := log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return text


def _stack(tmp_path: Path) -> LocalStack:
    return LocalStack(StackOptions(out=tmp_path, prometheus=False, router=False))


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="sets signal handlers")
def test_a_second_ctrl_c_during_the_stop_leaves_nothing_running(tmp_path: Path) -> None:
    """The stop ran one process at a time; a Ctrl-C in its wait ended it, Prometheus and Alertmanager ran on."""
    stack = _stack(tmp_path)
    stand_ins = [stack.supervisor.start(name, [sys.executable, "-c", SLOW_TO_STOP])
                 for name in ("alertmanager", "prometheus")]  # fmt: skip
    for managed in stand_ins:
        _wait_for(managed.log_path, "ready")
    ctrl_c = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        still: object = stack.stop()
    except KeyboardInterrupt:
        still = "interrupted"
    finally:
        ctrl_c.join()
        for managed in stand_ins:
            with contextlib.suppress(ProcessLookupError):
                managed.process.kill()
            managed.process.wait(10)
    assert still == [], still
    assert [m.process.returncode for m in stand_ins] == [0, 0], "each stopped on SIGTERM, none was left"


def test_a_process_that_ignores_sigterm_is_killed_and_one_deadline_serves_all(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(60)")
    stand_ins = [stack.supervisor.start(f"stubborn-{i}", [sys.executable, "-c", stubborn]) for i in range(3)]
    for managed in stand_ins:
        _wait_for(managed.log_path, "ready")
    began = time.monotonic()
    still = stack.supervisor.stop_all(timeout_s=0.5)
    took = time.monotonic() - began
    assert still == []
    assert [m.process.returncode for m in stand_ins] == [-signal.SIGKILL] * 3
    assert took < 3.0, f"one deadline for all three, not one each: {took:.1f} s"


def test_a_dead_controller_is_noticed_and_its_replicas_do_not_outlive_the_run(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    controller = stack.supervisor.start("controller", [sys.executable, "-c", CONTROLLER])
    stack._controller = controller
    replica = int(_wait_for(controller.log_path, "child").split()[1])
    try:
        stack._follow_replicas_cpus()  # as every second of the run
        controller.process.kill()
        controller.process.wait(10)
        stack._follow_replicas_cpus()
        alive_after_death = not gone(replica)
        still = stack.stop()
        stopped = gone(replica)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica, signal.SIGKILL)
    assert alive_after_death, "the stand-in controller's replica has no PR_SET_PDEATHSIG: the stack must stop it"
    assert still == [] and stopped, "the replica outlived the run"
    assert any(f"controller exited with code {-signal.SIGKILL}" in text for _, text in stack.state.events)
    summary = summarize(stack.state)
    assert summary["control_loop_ok"] is False
    assert summary["controller_exit"]["code"] == -signal.SIGKILL
    assert summary["controller_exit"]["loop_dead_s"] >= 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_nothing_the_run_started_outlives_a_run_killed_with_sigkill(tmp_path: Path) -> None:
    """A SIGKILLed (or OOM-killed) run left Prometheus, the controller and the router running in sessions of their
    own (the controller's replicas with them); the next run on the folder deleted their data under them."""
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                           cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert run.stdout is not None
    pids = [int(run.stdout.readline()) for _ in range(3)]
    run.kill()
    run.wait(10)
    run.stdout.close()
    try:
        left = still_running(pids)
    finally:
        kill_quietly(pids)
    assert left == [], "processes of the killed run still running"


def test_the_cli_names_what_is_still_running_after_an_interrupted_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "every process the run started is stopped" without looking."""
    from typer.testing import CliRunner

    import stack
    from cli.main import app

    def interrupted(*_args: object, **_kwargs: object) -> dict[str, object]:
        raise Interrupted(["prometheus (pid 4242)"])

    monkeypatch.setattr(stack, "run_stack", interrupted)
    result = CliRunner().invoke(app, ["up", "--out", str(tmp_path), "--no-live", "--no-inject-slowdown"])
    assert result.exit_code == 130, result.output
    assert "still running after the stop: prometheus (pid 4242)" in result.output
    assert "every process the run started is stopped" not in result.output


def test_the_cli_exits_1_when_the_control_loop_died_during_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose controller died printed its summary and exited 0, as if the loop had run."""
    from typer.testing import CliRunner

    import stack
    from cli.main import app

    summary = {"requests": 10, "control_loop_ok": False, "still_running": [], "events": [], "plots": [],
               "controller_exit": {"code": -9, "at_s": 12.0, "loop_dead_s": 48.5}}
    monkeypatch.setattr(stack, "run_stack", lambda *_args, **_kwargs: summary)
    result = CliRunner().invoke(app, ["up", "--out", str(tmp_path), "--no-live", "--no-inject-slowdown"])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())  # rich wraps long lines
    assert "the control loop was dead for the last 48.5 s: the controller exited with code -9 at 12 s" in said


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="sets signal handlers")
def test_a_ctrl_c_while_an_interrupted_run_writes_its_results_does_not_cut_them_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handlers came back before the results were written: one more Ctrl-C lost summary.json and the CLI's
    check of what was still running."""
    from stack.run import _finish

    stack = _stack(tmp_path)
    stack.state.interrupted = True
    written: list[bool] = []

    def slow_write() -> dict[str, object]:
        time.sleep(0.6)
        written.append(True)
        return {}

    monkeypatch.setattr(stack, "write_results", slow_write)
    before = signal.getsignal(signal.SIGTERM)
    ctrl_c = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        still: object = _finish(stack, signal.SIG_DFL)
    except KeyboardInterrupt:
        still = "interrupted"
    finally:
        ctrl_c.join()
        restored = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)
    assert still == [] and written == [True]
    assert restored == signal.SIG_DFL, "SIGTERM's handler from before the run is back"


LEADER_LEAVING_A_WORKER = (
    "import subprocess, sys\n"
    "worker = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)'])\n"
    "print(worker.pid, flush=True)\n"
)
"""A group leader that starts a worker ignoring SIGTERM and exits at once (an API server that crashed)."""


def test_the_group_of_a_leader_that_exited_is_stopped_and_named_until_it_is_gone() -> None:
    """The leader had exited, so it was skipped: its worker went on running, and nothing said so."""
    leader = subprocess.Popen([sys.executable, "-c", LEADER_LEAVING_A_WORKER], stdout=subprocess.PIPE,
                              start_new_session=True)  # fmt: skip
    assert leader.stdout is not None
    worker = int(leader.stdout.readline())
    try:
        assert leader.stdout.readline() == b"\n"  # the worker ignores SIGTERM from here on
        leader.wait(10)
        assert stop_processes([leader], timeout_s=0.5) == []
        assert not still_running([worker], 5.0)
    finally:
        kill_quietly([worker])
        leader.stdout.close()
