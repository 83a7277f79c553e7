"""One policy a model in the store: every write refuses a second policy of a model, in the write's transaction,
and two writers racing for one model (another process's included) leave one policy of it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.policy import Policy
from controller.store import ModelHeldError, Store
from controller.store.tables import PolicyRow, PolicyVersionRow


def _policy(name: str, model: str = "m", max_replicas: int = 8) -> Policy:
    return Policy.model_validate(
        {"name": name, "target": {"kind": "model", "model": model}, "scaling": {"max_replicas": max_replicas}}
    )


def _store(tmp_path: Path) -> Store:
    return Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")


def test_every_write_refuses_a_second_policy_of_a_model_naming_both(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.create_policy(_policy("team-a"))
    with pytest.raises(ModelHeldError) as caught:
        store.create_policy(_policy("team-b"))
    assert (caught.value.model, caught.value.holder, caught.value.policy) == ("m", "team-a", "team-b")
    with pytest.raises(ModelHeldError, match="model 'm' is watched by policy 'team-a' already"):
        store.replace_policy(_policy("team-b"), create=True)
    with pytest.raises(ModelHeldError):  # all or none: team-a's change is not written either
        store.write_policies([(_policy("team-a", max_replicas=4), 1), (_policy("team-b"), None)])
    assert store.replace_policy(_policy("team-a", max_replicas=5))[0].version == 2  # the holder itself may
    assert [stored.policy.name for stored in store.list_policies()] == ["team-a"]


def test_a_model_given_up_or_deleted_is_free_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.create_policy(_policy("team-a"))
    store.replace_policy(_policy("team-a", "n"))
    store.create_policy(_policy("team-b"))  # m, which team-a gave up
    store.delete_policy("team-a")
    assert store.replace_policy(_policy("team-c", "n"), create=True)[1]
    with pytest.raises(ModelHeldError, match="policy 'team-c' already"):
        store.create_policy(_policy("team-d", "n"))


def test_another_process_taking_the_model_between_the_check_and_the_write_leaves_one_policy(tmp_path: Path) -> None:
    """Two controllers on one database do not share the write lock: the one whose check ran before the other's
    write would have stored a second policy of the model."""
    ours, theirs = _store(tmp_path), _store(tmp_path)
    real, raced = ours._holder, []

    def holder_then_race(session: Any, policy: Policy) -> str | None:
        found = real(session, policy)
        if not raced:
            raced.append(theirs.create_policy(_policy("team-a")))
        return found

    ours._holder = holder_then_race  # type: ignore[method-assign]
    with pytest.raises(ModelHeldError, match="policy 'team-a' already: policy 'team-b'"):
        ours.create_policy(_policy("team-b"))
    assert [stored.policy.name for stored in ours.list_policies()] == ["team-a"]


def test_policies_of_one_model_stored_before_the_rule_still_load_and_must_part_to_change(tmp_path: Path) -> None:
    store = _store(tmp_path)
    now = datetime.now(UTC)
    with store.engine.begin() as connection:
        for name in ("team-a", "team-b"):
            spec = _policy(name).model_dump(mode="json")
            connection.execute(PolicyRow.__table__.insert().values(
                name=name, version=1, spec=spec, created_at=now, updated_at=now))  # fmt: skip
            connection.execute(PolicyVersionRow.__table__.insert().values(
                name=name, version=1, operation="create", spec=spec, at=now))  # fmt: skip
    assert [stored.policy.model_name for stored in store.list_policies()] == ["m", "m"]
    with pytest.raises(ModelHeldError, match="policy 'team-b' already: policy 'team-a'"):
        store.replace_policy(_policy("team-a", max_replicas=4))
    store.delete_policy("team-b")
    assert store.replace_policy(_policy("team-a", max_replicas=4))[0].version == 2
