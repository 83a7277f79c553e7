"""The routing window and request timings."""

from __future__ import annotations

import numpy as np
import pytest

from engine.stats import RequestTiming, RoutingDelta, RoutingWindow


def test_routing_window_slides_and_resets() -> None:
    window = RoutingWindow(num_layers=1, num_experts=2, num_ranks=2, window_steps=2)
    for ranks in ([1, 1], [3, 1], [5, 1]):
        window.add(RoutingDelta(np.array([[ranks[0], ranks[1]]]), np.array([ranks])))
    assert window.rank_tokens.tolist() == [[8, 2]]
    np.testing.assert_allclose(window.imbalance(), [0.6])
    np.testing.assert_allclose(window.balancedness(), [5 / 8])
    window.reset()
    assert window.rank_tokens.tolist() == [[0, 0]]
    window.add(RoutingDelta(np.zeros((1, 2), dtype=np.int64), np.zeros((1, 4), dtype=np.int64)))
    assert window.rank_tokens.shape == (1, 4)
    with pytest.raises(ValueError, match="window_steps"):
        RoutingWindow(1, 1, 1, window_steps=0)


def test_request_timing_derives_latencies() -> None:
    timing = RequestTiming("r", arrival_s=10.0, prompt_tokens=5, scheduled_s=10.5, first_token_s=11.0,
                           token_times_s=[11.0, 11.25, 11.75], finished_s=12.0)
    assert timing.ttft_s == 1.0
    assert timing.itls_s == [0.25, 0.5]
    assert (timing.queue_s, timing.prefill_s, timing.decode_s, timing.e2e_s) == (0.5, 0.5, 1.0, 2.0)
