"""The fluid fleet's per-tick arithmetic: a trace's arrivals are kept to its end."""

from __future__ import annotations

import numpy as np
import pytest

from controller.replay.fluid import count_loads


@pytest.mark.parametrize("tick_s", [15.0, 60.0, 70.0])
def test_count_loads_keeps_the_last_partial_ticks_arrivals(tick_s: float) -> None:
    counts = np.full(7, 100.0)  # seven 10 s bins: 70 s, not a whole number of most ticks
    rates, prompt, output = count_loads(counts, 10.0, tick_s, 200.0, 50.0)
    assert float(rates.sum() * tick_s) == pytest.approx(700.0)  # as request by request, which rounds up
    assert np.allclose(prompt, rates * 200.0) and np.allclose(output, rates * 50.0)
