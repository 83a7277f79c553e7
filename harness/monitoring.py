"""Prometheus and Alertmanager as local processes, for the local stack and the end-to-end tests.

Each ``*_command`` writes the config into ``workdir`` and returns the command line;
the caller starts it (:func:`harness.processes.start_process`) and waits on ``/-/ready``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("alertmanager", "prometheus-alertmanager")
"""Debian's package installs Alertmanager as ``prometheus-alertmanager``."""


def find_binary(*names: str) -> str | None:
    """The first of ``names`` on PATH, None when none is installed."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def _write_config(path: Path, config: Mapping[str, Any] | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False))
    return path


def prometheus_command(exe: str, workdir: Path, *, port: int, config: Mapping[str, Any] | str) -> list[str]:
    """Prometheus on 127.0.0.1:``port`` with ``config`` (a prometheus.yml mapping or text), data under ``workdir``."""
    config_path = _write_config(workdir / "prometheus.yml", config)
    return [
        exe, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d", "--log.level=warn",
    ]  # fmt: skip


def alertmanager_command(exe: str, workdir: Path, *, port: int, config: Mapping[str, Any] | str) -> list[str]:
    """Alertmanager on 127.0.0.1:``port`` with clustering off."""
    config_path = _write_config(workdir / "alertmanager.yml", config)
    return [
        exe, f"--config.file={config_path}", f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn",
    ]  # fmt: skip


def scrape_config(
    targets: Mapping[str, list[str]], *, interval_s: float = 2.0, rule_files: list[Path] | None = None,
    alertmanager_port: int | None = None, discovered: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A prometheus.yml mapping scraping ``targets`` (job -> host:port list) and ``discovered`` (job -> the URL
    of an HTTP service discovery, e.g. the controller's ``/v1/scrape-targets``, read every ``interval_s``)."""
    jobs = [{"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()]
    jobs += [{"job_name": job, "http_sd_configs": [{"url": url, "refresh_interval": f"{interval_s:g}s"}]}
             for job, url in (discovered or {}).items()]  # fmt: skip
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "rule_files": [str(p) for p in rule_files or []],
        "scrape_configs": jobs,
    }
    if alertmanager_port is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]}
    return config


__all__ = [
    "ALERTMANAGER_BINARIES",
    "PROMETHEUS_BINARIES",
    "alertmanager_command",
    "find_binary",
    "prometheus_command",
    "scrape_config",
]
