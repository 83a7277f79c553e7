"""Two controllers on one database (two Store instances: no shared write lock) racing for one policy: a write
over a version is conditional on the version the database still has, so a lost race is a 412 or a 404, never a
silent overwrite nor the database's own words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from contracts.errors import NotFoundError
from controller.policy import Policy
from controller.store import StaleVersionError, Store
from controller.store.tables import PolicyRow


def _policy(max_replicas: int = 8) -> Policy:
    return Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"},
                                  "scaling": {"max_replicas": max_replicas}})  # fmt: skip


def _two_stores(tmp_path: Path) -> tuple[Store, Store]:
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    ours, theirs = Store(url), Store(url)
    ours.create_policy(_policy())
    return ours, theirs


def _theirs_first(ours: Store, write: Callable[[], object]) -> None:
    """The other process's ``write`` lands after ours read the policy and checked its version, before ours
    writes (what SQLite's reads outside the write transaction let happen)."""
    raced: list[object] = []

    def check_then_race(row: PolicyRow, expected_version: int | None) -> None:
        Store._check_version(row, expected_version)
        if not raced:
            raced.append(write())

    ours._check_version = check_then_race  # type: ignore[method-assign]


def test_two_writes_over_one_version_one_wins_the_other_is_stale(tmp_path: Path) -> None:
    """Both got 200 (versions 2 and 3): the second overwrote the first, which its If-Match was to prevent."""
    ours, theirs = _two_stores(tmp_path)
    _theirs_first(ours, lambda: theirs.replace_policy(_policy(20), expected_version=1))
    with pytest.raises(StaleVersionError, match="is at version 2, not version 1"):
        ours.replace_policy(_policy(30), expected_version=1)
    stored = ours.get_policy("p")
    assert (stored.version, stored.policy.scaling.max_replicas) == (2, 20)
    assert [v.version for v in ours.policy_history("p")] == [1, 2]


def test_a_delete_over_a_version_another_writer_changed_is_stale(tmp_path: Path) -> None:
    """It was a 409 with the database's UNIQUE-constraint text (the delete took the version the change took)."""
    ours, theirs = _two_stores(tmp_path)
    _theirs_first(ours, lambda: theirs.replace_policy(_policy(20), expected_version=1))
    with pytest.raises(StaleVersionError, match="is at version 2, not version 1"):
        ours.delete_policy("p", expected_version=1)
    assert ours.get_policy("p").version == 2


def test_a_write_over_a_version_another_writer_deleted_is_stale(tmp_path: Path) -> None:
    """It was a 503 with SQLAlchemy's "expected to update 1 row(s); 0 were matched"."""
    ours, theirs = _two_stores(tmp_path)
    _theirs_first(ours, lambda: theirs.delete_policy("p", expected_version=1))
    with pytest.raises(StaleVersionError, match="'p' does not exist, not version 1"):
        ours.replace_policy(_policy(30), expected_version=1, create=True)
    with pytest.raises(NotFoundError):
        ours.get_policy("p")


def test_writes_without_a_version_land_over_the_other_writer(tmp_path: Path) -> None:
    ours, theirs = _two_stores(tmp_path)
    _theirs_first(ours, lambda: theirs.replace_policy(_policy(20)))
    assert ours.replace_policy(_policy(30))[0].version == 3
    (tmp_path / "again").mkdir()
    ours, theirs = _two_stores(tmp_path / "again")
    _theirs_first(ours, lambda: theirs.delete_policy("p"))
    with pytest.raises(NotFoundError):  # deleted meanwhile: as if it had been gone before
        ours.delete_policy("p")
