"""The replay's decode clock, and inter-token latencies stretched only by the prefills a decode overlaps."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.traces import RequestTrace
from controller.capacity import ReplicaProfile, Targets
from controller.replay.decode_clock import DecodeClock
from controller.replay.fleet import RequestFleet
from controller.replay.world import ProfileCache, World

PROFILE = ReplicaProfile(name="t", prefill_tokens_per_s=10_000.0, itl_base_s=0.01, itl_per_seq_s=0.001,
                         ttft_overhead_s=0.02, kv_capacity_tokens=100_000, max_num_seqs=64,
                         prefill_chunk_tokens=512)  # fmt: skip


def test_without_prefills_decode_time_is_wall_time() -> None:
    clock = DecodeClock()
    assert clock.virtual(2.5) == 2.5
    assert clock.real(2.5) == 2.5


def test_a_prefill_takes_its_compute_time_out_of_the_decode() -> None:
    clock = DecodeClock()
    clock.add_prefill(1.0, 3.0, 1.0)  # 2 s of chunks, half of it prefill compute
    assert clock.virtual(1.0) == 1.0
    assert clock.virtual(2.0) == pytest.approx(1.5)
    assert clock.virtual(3.0) == pytest.approx(2.0)
    assert clock.virtual(4.0) == pytest.approx(3.0)
    assert clock.real(1.5) == pytest.approx(2.0)
    assert clock.real(3.0) == pytest.approx(4.0)
    # A second prefill queued right behind the first: the clock stays continuous and final up to its end.
    clock.add_prefill(3.0, 4.0, 1.0)  # all compute: no decode step at all
    assert clock.virtual(4.0) == pytest.approx(2.0)
    assert clock.real(2.0) == pytest.approx(3.0)  # the earliest time decode time reaches 2
    assert clock.real(2.5) == pytest.approx(4.5)


def test_trimming_keeps_every_answer_at_or_after_the_trim_time() -> None:
    clock, reference = DecodeClock(), DecodeClock()
    for k in range(1000):
        for c in (clock, reference):
            c.add_prefill(k + 0.25, k + 0.75, 0.25)
    clock.trim(900.0)
    for t in (900.0, 912.3, 999.9, 1005.0):
        assert clock.virtual(t) == reference.virtual(t)
        assert clock.real(reference.virtual(t)) == pytest.approx(t)


def _fleet(arrival: list[float], prompts: list[int], outputs: list[int]) -> RequestFleet:
    trace = RequestTrace("t", np.array(arrival), np.array(prompts, dtype=np.int64),
                         np.array(outputs, dtype=np.int64))  # fmt: skip
    return RequestFleet(trace, ProfileCache(PROFILE, World(), Targets()), initial_replicas=1, tick_s=15.0)


def test_a_decode_is_stretched_by_exactly_the_prefill_it_overlaps() -> None:
    # Request 0 decodes 100 gaps for about 1.1 s; request 1's 2,000-token prompt is prefilled meanwhile.
    fleet = _fleet([0.0, 0.5], [100, 2000], [101, 2])
    fleet.advance(30.0)
    fleet.sample(30.0)
    first_token = fleet.ttft_s[0]  # it arrived at 0
    step = PROFILE.step_s(1.0)
    compute = 2000 / PROFILE.prefill_tokens_per_s
    assert fleet.finish_s[0] == pytest.approx(first_token + 100 * step + compute)
    assert fleet.itl_s[0] == pytest.approx(step + compute / 100)
    # Request 1 decodes after its own prefill, beside request 0 (a batch of two), and nothing is prefilled then.
    assert fleet.itl_s[1] == pytest.approx(PROFILE.step_s(2.0))


def test_a_prefill_that_ended_before_a_decode_began_does_not_stretch_it() -> None:
    # Request 0's 5,000-token prompt fills most of the first tick; request 1 arrives after it is prefilled.
    fleet = _fleet([0.0, 1.0], [5000, 10], [2, 50])
    fleet.advance(15.0)
    fleet.sample(15.0)
    fleet.advance(30.0)
    fleet.sample(30.0)
    assert fleet.ttft_s[0] < 1.0
    assert fleet.itl_s[1] == pytest.approx(PROFILE.step_s(1.0))


def test_requests_still_decoding_at_the_end_are_settled_by_the_outcomes() -> None:
    fleet = _fleet([0.0], [100], [1001])
    fleet.advance(5.0)
    fleet.sample(5.0)
    assert not np.isfinite(fleet.finish_s[0])  # about 11 s of decode left
    outcomes = fleet.outcomes(1)
    assert fleet.finish_s[0] == pytest.approx(fleet.ttft_s[0] + 1000 * PROFILE.step_s(1.0))
    assert outcomes.good_itl.sum() == 1


def test_requests_on_a_removed_replica_finish_as_it_would_have_served_them() -> None:
    trace = RequestTrace("t", np.array([0.0, 0.0]), np.array([100, 100], dtype=np.int64),
                         np.array([501, 501], dtype=np.int64))  # fmt: skip
    fleet = RequestFleet(trace, ProfileCache(PROFILE, World(), Targets()), initial_replicas=2, tick_s=15.0)
    fleet.advance(1.0)
    fleet.sample(1.0)
    assert fleet.scale_to(1, 1.0)
    fleet.advance(30.0)
    fleet.sample(30.0)
    step = PROFILE.step_s(1.0)  # the two went to different replicas: each decodes alone
    assert np.allclose(fleet.finish_s, fleet.ttft_s + 500 * step)
    assert np.allclose(fleet.itl_s, step)
