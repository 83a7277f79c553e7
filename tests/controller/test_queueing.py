"""The queueing formulas of the capacity model, by hand."""

from __future__ import annotations

import math

import pytest

from controller.queueing import erlang_c, mgn_waits


def test_erlang_c_by_hand() -> None:
    # Two servers at rho 0.5 (offered 1 Erlang): B(2, 1) = 0.5 / 2.5 = 0.2, C = 0.2 / (1 - 0.5 * 0.8) = 1/3.
    assert erlang_c(2, 0.5) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.3) == pytest.approx(0.3)  # M/M/1: an arrival waits with probability rho
    mean_wait, p99 = mgn_waits(2, 0.5, 0.1, 1.0)
    conditional = 0.1 / (2 * 0.5)
    assert mean_wait == pytest.approx(conditional / 3)
    assert p99 == pytest.approx(conditional * math.log((1 / 3) / 0.01))
