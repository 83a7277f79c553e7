"""``moeslo controller serve`` as a real process, driven by ``moeslo policy ...``; its state outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import UnavailableError
from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from harness.processes import free_port, stop_process, wait_healthy

TOKEN = "cli-token"


def _start(db: Path, port: int, **env_vars: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MOESLO_CONTROLLER_API_TOKEN": TOKEN, **env_vars}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "moeslo"), "controller", "serve", "--db", str(db), "--port", str(port),
         "--tick-interval-s", "0.3"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, 60.0, name="moeslo controller serve", interval_s=0.2)
    except UnavailableError:
        process.kill()
        raise
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, 20.0, sig=signal.SIGINT)


@pytest.mark.integration
def test_serve_apply_get_list_delete_and_restart(tmp_path: Path) -> None:
    db, port = tmp_path / "controller.db", free_port()
    url = f"http://127.0.0.1:{port}"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(
        "name: chat\ntarget: {kind: model, model: m}\nmode: advisory\n---\n"
        "name: batch\ntarget: {kind: model, model: b}\nscaling: {min_replicas: 0, max_replicas: 2}\n"
    )
    runner = CliRunner()
    server = _start(db, port)
    try:
        denied = runner.invoke(app, ["policy", "apply", "-f", str(policy_file), "--url", url])
        assert denied.exit_code == 2 and "HTTP 401" in denied.output
        applied = runner.invoke(app, ["policy", "apply", "-f", str(policy_file), "--url", url, "--token", TOKEN,
                                      "--json"])
        assert applied.exit_code == 0, applied.output
        assert [item["name"] for item in json.loads(applied.stdout)] == ["chat", "batch"]
        # A mapping with a `policies` list, as load_policies reads it; the token from the environment.
        listed_file = tmp_path / "listed.yaml"
        listed_file.write_text("policies:\n- name: chat\n  target: {kind: model, model: m}\n  mode: advisory\n")
        reapplied = runner.invoke(app, ["policy", "apply", "-f", str(listed_file), "--url", url, "--json"],
                                  env={"MOESLO_CONTROLLER_TOKEN": TOKEN})  # fmt: skip
        assert reapplied.exit_code == 0, reapplied.output
        # The same policy in another file's shape: unchanged, so its version (and ETag) stays.
        assert [(item["name"], item["version"]) for item in json.loads(reapplied.stdout)] == [("chat", 1)]
        # A file with a bad policy writes none of its policies; one the controller refuses stops the rest
        # and is named, with those applied before it.
        model = "target: {kind: model, model: m%d}"  # one policy a model
        mixed = tmp_path / "mixed.yaml"
        mixed.write_text(f"name: good3\n{model % 3}\n---\nname: bad4\n{model % 4}\n"
                         f"scaling: {{min_replicas: 5, max_replicas: 2}}\n---\nname: good5\n{model % 5}\n")  # fmt: skip
        refused = runner.invoke(app, ["policy", "apply", "-f", str(mixed), "--url", url, "--token", TOKEN])
        assert refused.exit_code == 2 and "max_replicas" in refused.output and "[1]" in refused.output
        metadata = tmp_path / "metadata.yaml"
        metadata.write_text(f"name: good6\n{model % 6}\n---\nname: meta7\n"
                            "target: {kind: local, endpoints: ['http://169.254.169.254:80']}\n"
                            f"---\nname: good8\n{model % 8}\n")  # fmt: skip
        stopped = runner.invoke(app, ["policy", "apply", "-f", str(metadata), "--url", url, "--token", TOKEN])
        assert stopped.exit_code == 2 and "HTTP 422" in stopped.output
        message = " ".join(stopped.output.split())
        assert "policy 'meta7' not applied, nor those after it" in message
        assert "applied before it: good6 (version 1)" in message
        listed = runner.invoke(app, ["policy", "list", "--url", url, "--json"])
        assert sorted(item["name"] for item in json.loads(listed.stdout)) == ["batch", "chat", "good6"]
        runner.invoke(app, ["policy", "delete", "good6", "--url", url, "--token", TOKEN])
        got = runner.invoke(app, ["policy", "get", "chat", "--url", url, "--openslo"])
        assert got.exit_code == 0 and "apiVersion: openslo/v1" in got.stdout
        as_json = runner.invoke(app, ["policy", "get", "chat", "--url", url, "--openslo", "--json"])
        documents = json.loads(as_json.stdout)
        assert as_json.exit_code == 0 and {d["apiVersion"] for d in documents} == {"openslo/v1"}
        # A name is escaped whole: neither a fragment nor a dot segment can reach another policy.
        for alias in ("batch#typo", "zz/../batch", "batch?x=1"):
            wrong = runner.invoke(app, ["policy", "delete", alias, "--url", url, "--token", TOKEN])
            assert wrong.exit_code == 2 and ("not found" in wrong.output or "HTTP 422" in wrong.output), wrong.output
            assert runner.invoke(app, ["policy", "get", alias, "--url", url]).exit_code == 2
        assert runner.invoke(app, ["policy", "get", "batch", "--url", url]).exit_code == 0
        deleted = runner.invoke(app, ["policy", "delete", "batch", "--url", url, "--token", TOKEN])
        assert deleted.exit_code == 0
        missing = runner.invoke(app, ["policy", "get", "batch", "--url", url])
        assert missing.exit_code == 2 and "not found" in missing.output
        deadline = time.monotonic() + 20
        while not httpx.get(f"{url}/v1/decisions").json()["items"]:
            assert time.monotonic() < deadline, "no decision logged"
            time.sleep(0.2)
        status = httpx.get(f"{url}/v1/status").json()
        assert status["leader"] and [p["name"] for p in status["policies"]] == ["chat"]
        assert status["policies"][0]["stale"] is True  # no engines to scrape: held, reported stale
        assert "moeslo_evaluation_duration_seconds_count" in httpx.get(f"{url}/metrics").text
        page = httpx.get(f"{url}/ui/")
        assert page.status_code == 200 and 'data-policy="chat"' in page.text
    finally:
        _stop(server)
    assert server.stderr is not None
    assert f"status page: {url}/ui/" in server.stderr.read().decode()  # the console writes to stderr
    # The process is gone; a new one (here: the app in this process) finds everything in the file.
    settings = ControllerSettings(db=str(db))
    with TestClient(create_app(settings, Store(settings.db_url))) as client:
        names = [item["name"] for item in client.get("/v1/policies").json()["items"]]
        assert names == ["chat"]
        decisions = client.get("/v1/decisions", params={"policy": "chat"}).json()["items"]
        # No engines to scrape, none running: the policy's minimum alone asks for one (reason first), no data.
        assert decisions and decisions[-1]["reason"] == "below_min"
        history = client.get("/v1/policies/batch/history").json()["versions"]
        assert [v["operation"] for v in history] == ["delete", "create"]


@pytest.mark.integration
def test_the_cli_changes_policies_of_a_controller_that_requires_if_match(tmp_path: Path) -> None:
    """It sends the version it reads just before: an update and a delete go through, never a blind overwrite."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    policy_file = tmp_path / "p.yaml"
    runner = CliRunner()
    server = _start(tmp_path / "c.db", port, MOESLO_CONTROLLER_REQUIRE_IF_MATCH="true")
    try:
        for mode in ("advisory", "enforce"):
            policy_file.write_text(f"name: chat\ntarget: {{kind: model, model: m}}\nmode: {mode}\n")
            applied = runner.invoke(app, ["policy", "apply", "-f", str(policy_file), "--url", url, "--token", TOKEN])
            assert applied.exit_code == 0, applied.output
        got = runner.invoke(app, ["policy", "get", "chat", "--url", url, "--json"])
        assert json.loads(got.stdout)["version"] == 2 and json.loads(got.stdout)["policy"]["mode"] == "enforce"
        deleted = runner.invoke(app, ["policy", "delete", "chat", "--url", url, "--token", TOKEN])
        assert deleted.exit_code == 0, deleted.output
        missing = runner.invoke(app, ["policy", "get", "chat", "--url", url])
        assert missing.exit_code == 2 and "policy 'chat' not found" in missing.output  # the controller's words
    finally:
        _stop(server)


def test_serve_names_its_prometheus_without_the_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up line goes to logs: the URL's user:password (basic auth) is not in it."""
    monkeypatch.setattr("cli.controller.run_uvicorn", lambda *_args, **_kwargs: None)
    result = CliRunner().invoke(app, ["controller", "serve", "--db", str(tmp_path / "c.db"), "--port", "0",
                                      "--prometheus", "http://moeslo:s3cr3t@127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    said = result.output.replace("\n", "")  # the console wraps long lines
    assert "SLIs from http://***@127.0.0.1:9" in said and "s3cr3t" not in said
