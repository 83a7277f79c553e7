from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from contracts.errors import UnavailableError
from stack import profile
from stack.profile import quiet_start_rate
from stack.state import StackOptions, StackState


def test_the_quiet_start_follows_the_capacity_model_where_it_allows_a_measured_level() -> None:
    assert quiet_start_rate(2.64, 2.88, lightest=0.3) == (2.64, None)
    assert quiet_start_rate(0.3, 2.88, lightest=0.3) == (0.3, None)


def test_a_model_that_rules_out_every_measured_level_does_not_start_the_load_at_nothing() -> None:
    rate, why = quiet_start_rate(0.0, 0.3, lightest=0.3)
    assert rate == 0.3
    assert why is not None and "0.00 requests/s" in why and "0.30" in why


def test_a_profile_without_a_measured_level_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:  # fmt: skip
    """Every replica's sweep empty (no level had a successful request): a clear error, not min() of nothing."""
    import engine.config

    monkeypatch.setattr(engine.config.ModelConfig, "load", staticmethod(lambda _path: SimpleNamespace(vocab_size=100)))
    monkeypatch.setattr(profile, "_sweep_all", lambda *_args: [[], []])
    state = StackState(StackOptions(out=tmp_path, checkpoint=tmp_path))
    with pytest.raises(UnavailableError, match="no profile level had a successful request on any of the 2 replica"):
        profile.profile_replicas(state, ["http://127.0.0.1:9", "http://127.0.0.1:10"], lambda _line: None)
