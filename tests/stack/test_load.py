"""What ``moeslo up`` replays: options a trace would ignore are refused before anything starts."""

from __future__ import annotations

import pytest

from contracts.errors import ValidationError
from harness.traces import BUNDLED_CONVERSATION_SLICE
from stack.load import check_trace
from stack.state import StackOptions


def test_speedup_on_a_count_trace_is_refused() -> None:
    """--speedup 8 on the bundled count trace (the default) planned the very same load as --speedup 1."""
    with pytest.raises(ValidationError, match=r"--speedup applies to a request trace only.*leave it out"):
        check_trace(StackOptions(speedup=8.0), given={"speedup"})
    check_trace(StackOptions(speedup=8.0))  # not given: nothing to say


@pytest.mark.parametrize(("given", "named"), [({"arrivals"}, "--arrivals"), ({"base_load"}, "--base-load"),
                                              ({"arrivals", "base_load"}, "--arrivals and --base-load")])
def test_arrivals_and_base_load_on_a_request_trace_are_refused(given: set[str], named: str) -> None:
    """A request trace is replayed as its requests came: --arrivals and --base-load changed nothing."""
    options = StackOptions(trace=BUNDLED_CONVERSATION_SLICE, arrivals="poisson", base_load=0.2, speedup=2.0)
    with pytest.raises(ValidationError, match=f"{named} appl(y|ies) to a count trace only"):
        check_trace(options, given={*given, "speedup"})
    check_trace(options, given={"speedup"})
