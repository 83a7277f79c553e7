"""Profile fitting recovers a known replica; ``moeslo profile`` against a real ``moeslo serve``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.errors import ValidationError
from controller.capacity import ProfilePoint, ReplicaProfile
from controller.profiling import fit_profile
from harness.processes import free_port, wait_healthy

MOESLO = str(Path(sys.executable).parent / "moeslo")


def synthetic_points(itl_base: float, slope: float, prefill: float, prompt: int) -> list[ProfilePoint]:
    points = []
    for running in (1.0, 8.0, 24.0, 48.0):
        itl = itl_base + slope * running
        output_rate = running / itl
        points.append(
            ProfilePoint(
                request_rate_rps=output_rate / 64,
                prompt_tokens_per_s=output_rate / 64 * prompt,
                output_tokens_per_s=output_rate,
                ttft_p99_s=0.0,
                itl_p99_s=itl,
                ttft_p50_s=prompt / prefill + itl_base if running == 1.0 else 1.0,
                itl_p50_s=itl,
                requests=100,
            )
        )
    return points


def test_fit_recovers_a_known_replica() -> None:
    fitted = fit_profile(
        synthetic_points(0.008, 0.0003, 12_000.0, 512),
        prompt_tokens=512,
        kv_capacity_tokens=50_000,
        max_num_seqs=64,
        name="t",
        source="synthetic",
    )
    # The lightest point has one running sequence, so the base absorbs one slope step.
    assert fitted.itl_base_s == pytest.approx(0.0083, rel=1e-6)
    assert fitted.itl_per_seq_s == pytest.approx(0.0003, rel=0.05)
    assert fitted.prefill_tokens_per_s == pytest.approx(512 / (512 / 12_000 + 0.008 - 0.0083), rel=1e-6)
    assert ReplicaProfile.model_validate_json(fitted.to_json()) == fitted


def test_fit_needs_two_levels() -> None:
    with pytest.raises(ValidationError, match="two load levels"):
        fit_profile(
            synthetic_points(0.01, 0.0, 1000.0, 10)[:1],
            prompt_tokens=10,
            kv_capacity_tokens=1,
            max_num_seqs=1,
            name="t",
            source="s",
        )


@pytest.mark.integration
@pytest.mark.slow
def test_profile_against_moeslo_serve(tiny_checkpoint: Path, tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [MOESLO, "serve", "--checkpoint", str(tiny_checkpoint), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/v1/models", server, 60.0, name="moeslo serve", interval_s=0.3)
        out = tmp_path / "profile.json"
        result = subprocess.run(
            [
                MOESLO,
                "profile",
                "--url",
                f"http://127.0.0.1:{port}",
                "--out",
                str(out),
                "--rates",
                "1,4",
                "--duration",
                "3",
                "--prompt-tokens",
                "16",
                "--output-tokens",
                "8",
                "--vocab-size",
                "500",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        profile = ReplicaProfile.model_validate(json.loads(out.read_text()))
        assert len(profile.points) == 2
        assert profile.prefill_tokens_per_s > 0 and profile.itl_base_s > 0
    finally:
        server.terminate()
        server.wait(timeout=10)
