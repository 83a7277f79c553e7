"""Profile fitting recovers a known replica; ``moeslo profile`` against a real ``moeslo serve``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.errors import ValidationError
from controller.capacity import CapacityModel, Load, PrefixProbe, ProfilePoint, ReplicaProfile, Targets
from controller.profiling import MIN_TAIL_REQUESTS, fit_cached_token_cost, fit_profile, tail_slope
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


def level(rate: float, requests: int, ttft: float, itl: float, output: int = 64) -> ProfilePoint:
    """A measured level: ``requests`` of ``output`` tokens each over ``requests / rate`` seconds."""
    return ProfilePoint(request_rate_rps=rate, prompt_tokens_per_s=rate * 256, output_tokens_per_s=rate * output,
                        ttft_p99_s=ttft * 2, itl_p99_s=itl * 2, ttft_p50_s=ttft, itl_p50_s=itl, requests=requests)


def fit(points: list[ProfilePoint], probe: PrefixProbe | None = None) -> ReplicaProfile:
    return fit_profile(points, prompt_tokens=256, kv_capacity_tokens=50_000, max_num_seqs=64, name="t", source="s",
                       prefix_probe=probe)


# A replica with an 8 ms decode step plus 0.5 ms per sequence and 22 ms of prefill for 256 tokens.
HEAVIER = [level(4.0, 80, 0.040, 0.0105), level(8.0, 160, 0.060, 0.0125)]  # 2.7 and 6.4 running


def test_a_cold_single_request_at_the_lightest_level_does_not_drag_prefill_down() -> None:
    warm = fit([level(0.25, 5, 0.030, 0.0081), level(0.5, 10, 0.030, 0.0082), *HEAVIER])
    # The lightest level's one request was the replica's first: 120 ms instead of 30.
    cold = fit([level(0.2, 1, 0.120, 0.0080), level(0.5, 10, 0.030, 0.0082), *HEAVIER])
    assert cold.prefill_tokens_per_s == pytest.approx(256 / (0.030 - 0.0082), rel=1e-9)
    assert cold.prefill_tokens_per_s == pytest.approx(warm.prefill_tokens_per_s, rel=0.02)
    assert cold.itl_base_s == pytest.approx(0.0082)


def test_noise_in_one_level_moves_the_fit_little() -> None:
    light = [level(0.25, 6, 0.030, 0.0081), level(0.5, 10, 0.031, 0.0082), level(1.0, 20, 0.032, 0.0084)]
    clean = fit([*light, *HEAVIER])
    for i, p in enumerate(light):  # a hiccup in any one light level: three times the TTFT, half again the ITL
        noisy_level = p.model_copy(update={"ttft_p50_s": 0.090, "itl_p50_s": 0.0120})
        noisy = fit([*light[:i], noisy_level, *light[i + 1 :], *HEAVIER])
        assert noisy.prefill_tokens_per_s == pytest.approx(clean.prefill_tokens_per_s, rel=0.1)
        assert noisy.itl_base_s == pytest.approx(clean.itl_base_s, rel=0.05)
        assert noisy.itl_per_seq_s == pytest.approx(clean.itl_per_seq_s, rel=0.3)


def test_a_lone_light_level_is_still_used_when_nothing_light_has_more() -> None:
    fitted = fit([level(0.2, 1, 0.030, 0.0080), *HEAVIER])  # the next level is no longer light (b > 2)
    assert fitted.prefill_tokens_per_s == pytest.approx(256 / (0.030 - 0.0080))


def test_fewer_than_two_levels_with_latencies_are_refused() -> None:
    no_latency = ProfilePoint(request_rate_rps=1.0, prompt_tokens_per_s=256.0, output_tokens_per_s=64.0,
                              ttft_p99_s=0.0, itl_p99_s=0.0, requests=0)
    with pytest.raises(ValidationError, match="two load levels with latencies, got 1"):
        fit([level(0.5, 10, 0.030, 0.0082), no_latency])


def test_a_level_that_queues_for_prefill_is_not_light() -> None:
    # Short outputs keep the batch small at every rate, but at 12 req/s the median request waits for
    # other prompts (12 * 0.2 s of prefill per second): its TTFT is no prefill time.
    light = [level(0.5, 10, 0.030, 0.0082, output=4), level(1.0, 20, 0.031, 0.0082, output=4)]
    queued = level(12.0, 240, 0.200, 0.0090, output=4)
    assert fit([*light, queued]).prefill_tokens_per_s == pytest.approx(256 / (0.0305 - 0.0082))


def test_cached_token_cost_from_two_medians() -> None:
    # 100 ms of prefill cold; 75 % cached at a fifth of the cost: 100 * (0.25 + 0.75 * 0.2) = 40 ms.
    assert fit_cached_token_cost(0.110, 0.050, cached_share=0.75, fixed_s=0.010) == pytest.approx(0.2)
    assert fit_cached_token_cost(0.110, 0.035, cached_share=0.75, fixed_s=0.010) == pytest.approx(0.0)
    assert fit_cached_token_cost(0.110, 0.020, cached_share=0.75, fixed_s=0.010) == 0.0  # faster than possible
    assert fit_cached_token_cost(0.110, 0.130, cached_share=0.75, fixed_s=0.010) == 1.0  # slower than cold
    assert fit_cached_token_cost(0.110, 0.050, cached_share=0.0, fixed_s=0.010) == 0.0  # nothing was cached
    assert fit_cached_token_cost(0.008, 0.005, cached_share=0.75, fixed_s=0.010) == 0.0  # no prefill to compare


def test_the_fit_records_the_probe_and_its_cost() -> None:
    probe = PrefixProbe(cold_ttft_p50_s=0.0302, cached_ttft_p50_s=0.0152, cached_share=0.75, requests=5)
    fitted = fit([level(0.5, 10, 0.030, 0.0082), *HEAVIER], probe)
    # Less the 8.2 ms step: 22 ms cold, 7 ms cached, so 7 / 22 = 0.25 + 0.75 c.
    assert fitted.cached_token_cost == pytest.approx((7 / 22 - 0.25) / 0.75)
    assert fitted.prefix_probe == probe
    assert fit([level(0.5, 10, 0.030, 0.0082), *HEAVIER]).cached_token_cost == 0.0


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
                "64",
                "--output-tokens",
                "8",
                "--vocab-size",
                "500",
                "--warmup",
                "2",
                "--probe-pairs",
                "3",
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
        assert profile.prefix_probe is not None and profile.prefix_probe.requests == 3
        # 48 of 64 tokens shared: three whole 16-token blocks, found in the cache by the engine's own count.
        assert profile.prefix_probe.cached_share == pytest.approx(0.75)
        said = " ".join(result.stderr.split())  # the console wraps long lines
        assert "prefix probe: TTFT p50" in said and "(engine counters)" in said
        assert 0.0 <= profile.cached_token_cost <= 1.0
    finally:
        server.terminate()
        server.wait(timeout=10)


def _tail_points(slope: float, *, base: float = 0.006, prefill: float = 5000.0, prompt: int = 115,
                 output: int = 21) -> list[ProfilePoint]:  # fmt: skip
    """Levels whose median ITL stays flat but whose p99 is what the model predicts with ``slope``."""
    truth = ReplicaProfile(prefill_tokens_per_s=prefill, itl_base_s=base, itl_per_seq_s=slope,
                           kv_capacity_tokens=1 << 30)
    model = CapacityModel(truth, Targets(prompt_cv2=0.0))
    points = []
    for rate in (0.3, 1.0, 3.0, 8.0):
        load = Load(request_rate_rps=rate, prompt_tokens_per_s=rate * prompt, output_tokens_per_s=rate * output)
        points.append(ProfilePoint(
            request_rate_rps=rate, prompt_tokens_per_s=rate * prompt, output_tokens_per_s=rate * output,
            ttft_p99_s=0.05, itl_p99_s=model.predict(load, 1).itl_p99_s, ttft_p50_s=prompt / prefill + base,
            itl_p50_s=base, requests=max(2, round(rate * 200)),
        ))  # fmt: skip
    return points


def test_the_slope_follows_the_measured_p99_when_the_median_stays_flat() -> None:
    points = _tail_points(0.002)
    fitted = fit_profile(points, prompt_tokens=115, kv_capacity_tokens=100_000, max_num_seqs=64, name="t", source="s")
    assert fitted.itl_per_seq_s == pytest.approx(0.002, rel=0.02)  # the p50 line alone says 0
    assert tail_slope(points, itl_base_s=0.006, prefill_tokens_per_s=5000.0) == pytest.approx(0.002, rel=0.02)


def test_the_tail_fit_skips_thin_levels_and_one_wild_level() -> None:
    points = _tail_points(0.002)
    wild = points[2].model_copy(update={"itl_p99_s": 0.5})  # one level's p99 hit by a stall
    thin = points[0].model_copy(update={"itl_p99_s": 0.9, "requests": MIN_TAIL_REQUESTS - 1})
    fitted = tail_slope([thin, points[1], wild, points[3]], itl_base_s=0.006, prefill_tokens_per_s=5000.0)
    assert 0.0015 < fitted < 0.05  # the median of three levels, the thin one left out
    assert tail_slope(points[:1], itl_base_s=0.006, prefill_tokens_per_s=5000.0) == 0.0  # nothing thick enough
