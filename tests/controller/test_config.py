"""Controller settings: YAML file, environment, explicit overrides; every problem reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contracts.errors import DataError, ValidationError
from controller.config import ControllerSettings, load_settings


def test_defaults_are_the_embedded_mode() -> None:
    settings = load_settings()
    assert settings.embedded and settings.prometheus_url is None and settings.actuator == "dryrun"
    assert settings.db_url == "sqlite+pysqlite:///moeslo-controller.db"


def test_file_then_env_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "port: 9000\nprometheus_url: http://127.0.0.1:9090\nactuator: local\n"
        "local: {checkpoint: ckpt, first_port: 20000}\nscrape_endpoints: {m: ['http://127.0.0.1:1']}\n"
    )
    monkeypatch.setenv("MOESLO_CONTROLLER_PORT", "9100")
    monkeypatch.setenv("MOESLO_CONTROLLER_API_TOKEN", "t0k")
    settings = load_settings(path, db="postgresql+psycopg://u@db/moeslo", port=None)
    assert settings.port == 9100  # env beats the file; a None override does not count
    assert settings.api_token is not None and settings.api_token.get_secret_value() == "t0k"
    assert settings.local.checkpoint == "ckpt" and settings.local.first_port == 20000
    assert settings.db_url == "postgresql+psycopg://u@db/moeslo" and not settings.embedded
    assert settings.scrape_endpoints == {"m": ("http://127.0.0.1:1",)}
    assert load_settings(path, port=9200).port == 9200


def test_an_environment_variable_for_one_field_of_a_section_keeps_the_files_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pod's name from the downward API names the holder; the file turned the election on.
    path = tmp_path / "c.yaml"
    path.write_text("leader_election: {enabled: true, lease_name: moeslo}\nkubernetes: {in_cluster: true}\n")
    monkeypatch.setenv("MOESLO_CONTROLLER_LEADER_ELECTION__IDENTITY", "pod-a")
    monkeypatch.setenv("MOESLO_CONTROLLER_KUBERNETES__MAX_ATTEMPTS", "3")
    settings = load_settings(path)
    assert settings.leader_election.enabled and settings.leader_election.identity == "pod-a"
    assert settings.leader_election.lease_name == "moeslo"
    assert settings.kubernetes.in_cluster and settings.kubernetes.max_attempts == 3
    # A field set alone is judged with the file's others of its section: a lease of 3 s renewed every 1 s
    # (the default renew period, 5 s, would refuse it).
    path.write_text("leader_election: {enabled: true, renew_period_s: 1}\n")
    monkeypatch.setenv("MOESLO_CONTROLLER_LEADER_ELECTION__LEASE_DURATION_S", "3")
    settings = load_settings(path)
    assert (settings.leader_election.lease_duration_s, settings.leader_election.renew_period_s) == (3.0, 1.0)


def test_kubernetes_service_links_are_not_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the kubelet gives every pod in the namespace of a Service named moeslo-controller.
    links = {"PORT": "tcp://10.96.0.12:8090", "PORT_8090_TCP": "tcp://10.96.0.12:8090", "SERVICE_HOST": "10.96.0.12",
             "SERVICE_PORT": "8090", "SERVICE_PORT_HTTP": "8090", "PORT_8090_TCP_PROTO": "tcp",
             "PORT_8090_TCP_PORT": "8090", "PORT_8090_TCP_ADDR": "10.96.0.12"}  # fmt: skip
    for name, value in links.items():
        monkeypatch.setenv(f"MOESLO_CONTROLLER_{name}", value)
    path = tmp_path / "c.yaml"
    path.write_text("port: 8090\n")
    assert load_settings(path).port == 8090
    assert load_settings().port == ControllerSettings.model_fields["port"].default
    monkeypatch.setenv("MOESLO_CONTROLLER_PORT", "9000")  # a real setting still counts
    assert load_settings(path).port == 9000


def test_every_problem_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("port: -1\nactuator: helm\nleader_election: {lease_duration_s: 5, renew_period_s: 10}\nbogus: 1\n")
    with pytest.raises(ValidationError) as caught:
        load_settings(path)
    text = str(caught.value)
    for fragment in ("port:", "actuator:", "renew_period_s (10.0) must be shorter", "bogus:"):
        assert fragment in text


def test_unreadable_or_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing\.yaml"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: 1\n  nested: [\n")
    with pytest.raises(DataError, match=r"bad\.yaml:\d+: invalid YAML"):
        load_settings(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(DataError, match="must be a mapping"):
        load_settings(listing)


def test_rate_window_is_whole_seconds_of_at_least_two(tmp_path: Path) -> None:
    assert load_settings().rate_window_s == 60
    path = tmp_path / "c.yaml"
    path.write_text("rate_window_s: 10\n")
    assert load_settings(path).rate_window_s == 10
    for bad in ("1", "2.5"):
        path.write_text(f"rate_window_s: {bad}\n")
        with pytest.raises(ValidationError, match="rate_window_s"):
            load_settings(path)


def test_a_scrape_endpoint_that_is_no_url_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("scrape_endpoints: {m: ['http://127.0.0.1:8000', 'http://127.0.0.1:80800']}\n")
    with pytest.raises(ValidationError, match=r"scrape_endpoints\.m: endpoint 'http://127.0.0.1:80800' is not a valid"):
        load_settings(path)


def test_the_shutdown_grace_defaults_below_the_pods_termination_grace_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().shutdown_grace_s == 15.0  # deploy/ gives the controller's pod 30 s
    monkeypatch.setenv("MOESLO_CONTROLLER_SHUTDOWN_GRACE_S", "2.5")
    assert load_settings().shutdown_grace_s == 2.5
    assert load_settings(shutdown_grace_s=0).shutdown_grace_s == 0
    with pytest.raises(ValidationError, match="shutdown_grace_s"):
        load_settings(shutdown_grace_s=-1)


def test_a_local_command_with_a_literal_brace_is_refused_naming_the_part() -> None:
    # vLLM's --compilation-config takes JSON: its braces would be read as fields to fill in at every scale.
    command = ["vllm", "serve", "--port", "{port}", "--compilation-config", '{"level": 3}']
    with pytest.raises(ValidationError) as caught:
        load_settings(actuator="local", local={"command": command})
    message = str(caught.value)
    assert "local.command[5]" in message and "{{" in message
    with pytest.raises(ValidationError, match=r"local.command\[1\].*\{threds\}"):
        load_settings(local={"command": ["x", "--threads={threds}"]})
    with pytest.raises(ValidationError, match=r"local.command\[1\]"):
        load_settings(local={"command": ["x", "{port"]})
    doubled = load_settings(local={"command": [*command[:-1], '{{"level": 3}}']})
    assert doubled.local.command[-1] == '{{"level": 3}}'


def test_local_settings_that_cannot_work_on_this_host_are_refused_naming_the_setting() -> None:
    mine = sorted(os.sched_getaffinity(0))
    absent = max(mine) + 64
    with pytest.raises(ValidationError, match=rf"local.cpus: CPU\(s\) {absent} .*not among"):
        load_settings(local={"cpus": [mine[0], absent], "cpus_per_replica": 1})
    with pytest.raises(ValidationError, match=r"local.cpus_per_replica: 2 .* only 1 CPU"):
        load_settings(local={"cpus": [mine[0]], "cpus_per_replica": 2})
    with pytest.raises(ValidationError, match=rf"local.cpus_per_replica: {len(mine) + 1} .* {len(mine)} CPU"):
        load_settings(local={"cpus_per_replica": len(mine) + 1})
    with pytest.raises(ValidationError, match=r"local.host: '::1' is not an IPv4 address"):
        load_settings(local={"host": "::1"})
    fits = load_settings(local={"host": "localhost", "cpus": [mine[0]], "cpus_per_replica": 1})
    assert fits.local.host == "localhost"
