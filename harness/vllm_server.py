"""A vLLM OpenAI-compatible server as a child process (benchmarks and the vLLM integration tests)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contracts.catalogue import vllm_slo_bucket_args
from harness.processes import free_port, start_process, stop_process, wait_healthy

VLLM_VENV = Path(__file__).resolve().parents[1] / ".venv-vllm"
"""Where `make vllm-venv` puts vLLM CPU (kept apart from the core install)."""


def vllm_python() -> Path | None:
    """The vLLM venv's interpreter, None when ``make vllm-venv`` has not been run."""
    python = VLLM_VENV / "bin" / "python"
    return python if python.exists() else None


def slo_bucket_args() -> list[str]:
    """vLLM flags that put the 20 ms ITL objective on a bucket edge, as our engine does.

    vLLM 0.32's ITL edges go 0.01, 0.025: without this the controller can
    compute p99 but not the exact good-ratio at 0.02 s.  The deploy/ manifests
    pass the same flag (:func:`contracts.catalogue.vllm_slo_bucket_args`).
    """
    return vllm_slo_bucket_args()


@dataclass
class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1, in its own process group."""

    checkpoint: Path
    model_name: str = "moeslo-vllm"
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        python = vllm_python()
        if python is None:
            raise FileNotFoundError(f"no vLLM venv at {VLLM_VENV} (run `make vllm-venv`)")
        return [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.checkpoint), "--served-model-name", self.model_name,
            "--skip-tokenizer-init", "--gpu-memory-utilization", "0.1",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--enforce-eager", "--max-model-len", "1024", "--no-enable-prefix-caching",
            "--disable-uvicorn-access-log", *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO", **self.env}
        for name in ("MOESLO_VLLM_PLUGIN", "PROMETHEUS_MULTIPROC_DIR", "MOESLO_VLLM_METRICS_DIR"):
            if name not in self.env:
                env.pop(name, None)  # only what this server was given
        self.proc = start_process(self.command(), log_path=self.log_path, env=env)

    def wait_healthy(self, timeout_s: float) -> None:
        assert self.proc is not None
        wait_healthy(f"{self.base_url}/health", self.proc, timeout_s, name=f"vLLM at {self.base_url}",
                     log_path=self.log_path, interval_s=0.5)

    def stop(self) -> None:
        """SIGTERM to the server's own process group (its engine core and workers), then SIGKILL."""
        if self.proc is not None:
            stop_process(self.proc, group=True)

    @contextlib.contextmanager
    def running(self, timeout_s: float = 420.0) -> Iterator[VllmServer]:
        self.start()
        try:
            self.wait_healthy(timeout_s)
            yield self
        finally:
            self.stop()


__all__ = ["VLLM_VENV", "VllmServer", "slo_bucket_args", "vllm_python"]
