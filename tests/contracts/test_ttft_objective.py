"""The allowance's label: six significant digits, and a finer allowance refused where an engine is told it."""

from __future__ import annotations

import pytest

from contracts.ttft_objective import exported_allowances, format_allowances


def test_an_engine_refuses_an_allowance_finer_than_its_label() -> None:
    """``2000:0.1234567`` wrote the series labelled 0.123457 with values normalized at 0.1234567."""
    with pytest.raises(ValueError, match=r"'2000:0\.1234567': at most 6 significant digits.*\(0\.123457\)"):
        exported_allowances("2000:0.1234567")
    assert format_allowances(exported_allowances("2000:0.123457")) == "1000:0.05,2000:0.123457"
