"""The controller's persistence: policies with versions, the decision log, and the load history.

SQLite (WAL journal, one file) is the embedded default; any SQLAlchemy URL
works for production.  Versions grow monotonically per name, across deletes
and re-creations, so an ETag (``"<version>"``) never names two different
specs.  A write over a stored version is conditional on it (``UPDATE`` and
``DELETE ... WHERE version = ?``, :class:`~controller.store.tables.PolicyRow`),
in another process too: the writer that lost a race reads again, and then
finds the winner's version (a :class:`StaleVersionError` when it expected its
own), never a silent overwrite.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import ValidationError as PydanticValidationError
from sqlalchemy import delete, exists, func, select
from sqlalchemy.exc import DataError as SqlDataError
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from contracts.errors import ConflictError, NotFoundError, UnavailableError
from controller.policy import STORED, Policy
from controller.store.engine import create_schema, in_memory, make_engine, redacted
from controller.store.records import (
    DecisionRecord,
    DecisionRefusedError,
    ModelHeldError,
    PolicyExistsError,
    PolicyVersion,
    StaleVersionError,
    StoredPolicy,
    UnreadablePolicy,
    UnreadablePolicyError,
)
from controller.store.series import DecisionPoint, PointQuery
from controller.store.tables import (
    DecisionRow,
    LoadHistoryRow,
    ModelRow,
    PolicyRow,
    PolicyVersionRow,
    decisions_of,
    spliced,
    versions_of,
)


class _WriteRaceError(ConflictError):
    """Another writer changed the policy between this write's read and its write (its row's version moved, or
    both took the same next version number): the loser's transaction is rolled back whole and tried again."""


WRITE_ATTEMPTS = 5
_T = TypeVar("_T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PolicyListing:
    """Every stored policy: those this version reads, by name, and those it cannot."""

    readable: list[StoredPolicy]
    unreadable: list[UnreadablePolicy]


def _utc(value: datetime) -> datetime:
    # SQLite drops the tzinfo; every stored time is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _refused(cause: BaseException | None) -> bool:
    """Whether the database refused a write for the values it holds (a constraint, a value too long, one the
    driver cannot encode), not for its own state (locked, gone): that write fails every time."""
    if isinstance(cause, IntegrityError | SqlDataError):
        return True
    return isinstance(cause, StatementError) and not isinstance(cause, DBAPIError)  # a value not encoded


def _complaint(exc: SQLAlchemyError) -> str:
    """The first line of what the database said, without the statement nor its parameters."""
    said = str(exc.orig).splitlines() if isinstance(exc, DBAPIError) else []
    return next((line for line in said if line.strip()), type(exc).__name__)


class Store:
    """Policies, their history and the decision log, behind plain methods."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.engine = make_engine(url)
            create_schema(self.engine)
        except (SQLAlchemyError, ImportError) as exc:
            # A path whose folder does not exist, an unknown scheme, a driver not installed: the user's setting.
            first_line = str(exc).splitlines()[0]
            raise UnavailableError(f"database {redacted(url)}: {type(exc).__name__}: {first_line}") from exc
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Parsed policies (or why not) by (name, version): a version never changes, and the tick loop reads
        # every policy every tick, so validating the same JSON again would be wasted work.
        self._parsed: dict[tuple[str, int], Policy | UnreadablePolicy] = {}
        # The API serves writes from a thread pool: one policy write at a time in this process (another
        # process racing for the same version, on a shared database, is retried instead).
        self._policy_writes = threading.Lock()
        # An in-memory database is one connection every thread shares: one session at a time on it (two at once
        # rolled back each other's transactions, and a broken connection was replaced by a new, empty database).
        self._serial: AbstractContextManager[object] = (
            threading.RLock() if url.startswith("sqlite") and in_memory(url) else nullcontext()
        )

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._serial:
            yield from self._serial_session()

    def _serial_session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except (ConflictError, NotFoundError):
            session.rollback()
            raise
        except (IntegrityError, StaleDataError) as exc:
            session.rollback()
            raise _WriteRaceError("another writer changed the same policies at the same time") from exc
        except SQLAlchemyError as exc:
            session.rollback()
            # The answer names the database's complaint; the statement and its values go to the log only.
            log.warning("policy store: %s", exc)
            raise UnavailableError(f"policy store ({self.engine.url.get_backend_name()}): {_complaint(exc)}") from exc
        finally:
            session.close()

    # ---- policies -------------------------------------------------------
    def get_policy(self, name: str) -> StoredPolicy:
        with self._session() as session:
            row = session.get(PolicyRow, name)
            if row is None:
                raise NotFoundError("policy", name)
            return self._stored(row)

    def policy_version(self, name: str) -> int:
        """The policy's current version (:class:`NotFoundError` if there is none), read without parsing it."""
        with self._session() as session:
            version = session.scalar(select(PolicyRow.version).where(PolicyRow.name == name))
            if version is None:
                raise NotFoundError("policy", name)
            return version

    def list_policies(self) -> list[StoredPolicy]:
        """The policies this version reads, by name; one it cannot is left out (:meth:`unreadable_policies`), so
        the tick loop, the status and the listing go on for the others."""
        return self.read_policies().readable

    def unreadable_policies(self) -> list[UnreadablePolicy]:
        """The stored policies left out of :meth:`list_policies`, and why."""
        return self.read_policies().unreadable

    def read_policies(self) -> PolicyListing:
        listing = PolicyListing([], [])
        with self._session() as session:
            for row in session.scalars(select(PolicyRow).order_by(PolicyRow.name)):
                try:
                    listing.readable.append(self._stored(row))
                except UnreadablePolicyError as exc:
                    listing.unreadable.append(UnreadablePolicy(exc.name, exc.version, exc.problem))
        return listing

    def create_policy(self, policy: Policy) -> StoredPolicy:
        """Store a new policy; :class:`PolicyExistsError` if the name is taken, :class:`ModelHeldError` if another
        policy watches its model."""
        return self._retrying(lambda: self._create(policy))

    def _create(self, policy: Policy) -> StoredPolicy:
        with self._session() as session:
            if session.get(PolicyRow, policy.name) is not None:
                raise PolicyExistsError(policy.name)
            self._hold_model(session, policy)
            return self._write(session, None, policy, "create")

    def replace_policy(
        self, policy: Policy, *, expected_version: int | None = None, create: bool = False
    ) -> tuple[StoredPolicy, bool]:
        """Replace (or, with ``create``, create) a policy; returns it and whether it is new.  :class:`ModelHeldError`
        if another policy watches its model."""
        return self._retrying(lambda: self._replace(policy, expected_version, create))

    def _retrying(self, write: Callable[[], _T]) -> _T:
        """``write`` under the write lock, again when it lost a race.

        SQLite ignores ``FOR UPDATE``, so two writers (in two processes) can read the same version: the loser's
        conditional write matches no row, or takes the winner's version number, and it tries again (with an
        expected version, it then finds the winner's version: a stale ETag; a policy deleted meanwhile, none).
        """
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                with self._policy_writes:
                    return write()
            except _WriteRaceError as exc:
                if attempt == WRITE_ATTEMPTS:
                    raise ConflictError(f"{exc} {WRITE_ATTEMPTS} times in a row; try again") from exc
        raise AssertionError("unreachable")

    def _replace(self, policy: Policy, expected_version: int | None, create: bool) -> tuple[StoredPolicy, bool]:
        with self._session() as session:
            row = session.get(PolicyRow, policy.name, with_for_update=True)
            if row is None:
                if not create:
                    raise NotFoundError("policy", policy.name)
                if expected_version is not None:
                    raise StaleVersionError(policy.name, current=None, expected=expected_version)
                self._hold_model(session, policy)
                return self._write(session, None, policy, "create"), True
            self._check_version(row, expected_version)
            self._hold_model(session, policy)
            return self._write(session, row, policy, "update"), False

    def write_policies(self, planned: Sequence[tuple[Policy, int | None]]) -> list[StoredPolicy]:
        """Write several policies in one transaction, all or none: each over the version it was planned from, or,
        planned as new (None), only while its name is still free (:class:`ConflictError` if another writer took
        it meanwhile: the plan did not see that policy, so it must not replace it)."""
        return self._retrying(lambda: self._write_planned(planned))

    def _write_planned(self, planned: Sequence[tuple[Policy, int | None]]) -> list[StoredPolicy]:
        with self._session() as session:
            written = []
            for policy, version in planned:
                row = session.get(PolicyRow, policy.name, with_for_update=True)
                if row is None and version is not None:
                    raise StaleVersionError(policy.name, current=None, expected=version)
                if row is not None and version is None:
                    raise ConflictError(f"policy {policy.name!r} was created by another writer meanwhile")
                if row is not None:
                    self._check_version(row, version)
                self._hold_model(session, policy)
                written.append(self._write(session, row, policy, "create" if row is None else "update"))
            return written

    def delete_policy(self, name: str, *, expected_version: int | None = None) -> None:
        """Delete a policy (one this version cannot read too: nothing here parses it)."""
        self._retrying(lambda: self._delete(name, expected_version))

    def _delete(self, name: str, expected_version: int | None) -> None:
        with self._session() as session:
            row = session.get(PolicyRow, name, with_for_update=True)
            if row is None:
                raise NotFoundError("policy", name)
            self._check_version(row, expected_version)
            now = datetime.now(UTC)
            session.add(
                PolicyVersionRow(name=name, version=row.version + 1, operation="delete", spec=None, at=now)
            )
            session.delete(row)
            session.execute(delete(ModelRow).where(ModelRow.policy == name))

    def policy_history(
        self, name: str, *, after_version: int | None = None, before_version: int | None = None,
        limit: int | None = None, newest_first: bool = False
    ) -> list[PolicyVersion]:
        """The name's versions (deletions included) by version, oldest first: those after ``after_version`` and
        before ``before_version``, at most ``limit`` of them; with ``newest_first``, the newest ``limit`` newest
        first.  :class:`NotFoundError` when the name never had a policy (past the last version there are none)."""
        query = versions_of(name, after_version=after_version, before_version=before_version, newest_first=newest_first)
        with self._session() as session:
            rows = session.scalars(query.limit(limit)).all()
            if not rows and session.scalar(select(exists().where(PolicyVersionRow.name == name))) is not True:
                raise NotFoundError("policy", name)
            return [PolicyVersion(r.name, r.version, r.operation, r.spec, _utc(r.at)) for r in rows]

    def _hold_model(self, session: Session, policy: Policy) -> None:
        """Refuse ``policy`` when another policy watches its model; else mark the model its own (in the write's
        transaction).  This process's writes take turns (the write lock); two processes racing for one model
        both insert its mark, and the loser's retry finds the winner's policy."""
        model = policy.model_name
        holder = self._holder(session, policy)
        if holder is not None:
            raise ModelHeldError(model, holder=holder, policy=policy.name)
        session.execute(delete(ModelRow).where(ModelRow.policy == policy.name, ModelRow.model != model))
        mark = session.get(ModelRow, model, with_for_update=True)
        if mark is None:
            session.add(ModelRow(model=model, policy=policy.name))
        elif mark.policy != policy.name:
            if session.get(PolicyRow, mark.policy) is not None:  # written since the read
                raise _WriteRaceError(f"concurrent write: policy {mark.policy!r} took model {model!r}")
            mark.policy = policy.name  # left by a policy that is gone
        session.flush()

    def _holder(self, session: Session, policy: Policy) -> str | None:
        """The other policy that watches ``policy``'s model, if any: the one its mark names (every write keeps a
        policy's mark on its model), else one stored before the marks whose spec names the model.  Neither
        parses a marked policy, so one this version cannot read still holds its model."""
        model = policy.model_name
        marked = session.scalar(
            select(ModelRow.policy)
            .join(PolicyRow, PolicyRow.name == ModelRow.policy)
            .where(ModelRow.model == model, ModelRow.policy != policy.name)
        )
        if marked is not None:
            return marked
        unmarked = select(PolicyRow).where(
            PolicyRow.name != policy.name, ~exists().where(ModelRow.policy == PolicyRow.name)
        )
        for row in session.scalars(unmarked):
            try:
                if self._stored(row).policy.model_name == model:
                    return row.name
            except UnreadablePolicyError:
                continue  # unmarked and unreadable: its model is unknown (it does not run either)
        return None

    @staticmethod
    def _check_version(row: PolicyRow, expected_version: int | None) -> None:
        if expected_version is not None and row.version != expected_version:
            raise StaleVersionError(row.name, current=row.version, expected=expected_version)

    def _write(self, session: Session, row: PolicyRow | None, policy: Policy, operation: str) -> StoredPolicy:
        """A new version of the policy, or, when it is the stored one unchanged, the stored version as it is (a
        re-applied file must not churn the history, nor turn the ETags clients hold stale)."""
        spec = policy.model_dump(mode="json")
        if row is not None and row.spec == spec:
            return self._stored(row)
        now = datetime.now(UTC)
        last = session.scalar(
            select(func.max(PolicyVersionRow.version)).where(PolicyVersionRow.name == policy.name)
        )
        version = (last or 0) + 1
        if row is None:
            row = PolicyRow(name=policy.name, version=version, spec=spec, created_at=now, updated_at=now)
            session.add(row)
        else:
            row.version, row.spec, row.updated_at = version, spec, now
        session.add(
            PolicyVersionRow(name=policy.name, version=version, operation=operation, spec=spec, at=now)
        )
        session.flush()
        return self._stored(row)

    def _stored(self, row: PolicyRow) -> StoredPolicy:
        """The row as a policy; :class:`UnreadablePolicyError` when its spec does not validate."""
        key = (row.name, row.version)
        policy = self._parsed.get(key)
        if policy is None:
            if len(self._parsed) > 10_000:
                self._parsed.clear()
            policy = self._parsed[key] = self._parse(row)
        if isinstance(policy, UnreadablePolicy):
            raise policy.error()
        return StoredPolicy(
            policy=policy,
            version=row.version,
            created_at=_utc(row.created_at),
            updated_at=_utc(row.updated_at),
        )

    @staticmethod
    def _parse(row: PolicyRow) -> Policy | UnreadablePolicy:
        try:
            # A spec stored under an older, looser window rule still loads (and runs); a change to it must pass.
            return Policy.model_validate(row.spec, context={STORED: True})
        except PydanticValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors())
            unreadable = UnreadablePolicy(row.name, row.version, problem)
            # Once a version (the result is cached), though the tick loop leaves the policy out every tick.
            log.warning("%s; the controller leaves it out until then", unreadable.error())
            return unreadable

    # ---- decision log ---------------------------------------------------
    def append_decisions(self, records: Sequence[DecisionRecord]) -> list[int]:
        """Store decisions in one transaction; returns their ids.  A record the database refuses for what it holds
        fails the batch with :class:`DecisionRefusedError` (written again, it fails again); an outage is an
        :class:`UnavailableError`."""
        try:
            with self._session() as session:
                columns = [f.name for f in fields(DecisionRecord) if f.name != "id"]  # the id is the database's to give
                rows = [DecisionRow(**{name: getattr(r, name) for name in columns}) for r in records]
                session.add_all(rows)
                session.flush()
                return [row.id for row in rows]
        except (ConflictError, UnavailableError) as exc:
            if not _refused(exc.__cause__):
                raise
            first_line = str(exc.__cause__).splitlines()[0][:400]
            raise DecisionRefusedError(f"the database refused a decision record: {first_line}") from exc

    def list_decisions(
        self,
        *,
        policy: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        since: datetime | None = None,
        exclude_actions: Sequence[str] = (),
    ) -> list[DecisionRecord]:
        """Newest first; ``before_id`` pages backwards (keyset pagination); ``since`` and
        ``exclude_actions`` narrow to decisions at or after a time and of other actions.  With ``policy``,
        only the decisions since that policy was last created (:func:`~controller.store.tables.decisions_of`)."""
        query = select(DecisionRow).order_by(DecisionRow.id.desc()).limit(limit)
        if policy is not None:
            query = query.where(decisions_of(policy))
        if before_id is not None:
            query = query.where(DecisionRow.id < before_id)
        if since is not None:
            query = query.where(DecisionRow.at >= since)
        if exclude_actions:
            query = query.where(DecisionRow.action.not_in(list(exclude_actions)))
        with self._session() as session:
            return [self._record(row) for row in session.scalars(query).all()]

    def decision_points(
        self,
        policy: str,
        *,
        since: datetime,
        fields: Mapping[str, Sequence[str]],
        exclude_actions: Sequence[str] = (),
        limit: int = 50_000,
        after_id: int | None = None,
    ) -> list[DecisionPoint]:
        """A policy's decisions since ``since`` (and after ``after_id``) as numbers, oldest first
        (see :mod:`controller.store.series`)."""
        reader = PointQuery(fields, sqlite=self.engine.dialect.name == "sqlite")
        query = reader.select(policy, since=since, exclude_actions=exclude_actions, limit=limit, after_id=after_id)
        with self._session() as session:
            rows = session.execute(query).all()
        return reader.points(rows)

    def prune_decisions(self, *, keep_last: int) -> int:
        """Delete all but the newest ``keep_last`` decisions; returns how many went."""
        with self._session() as session:
            cutoff = session.scalar(
                select(DecisionRow.id).order_by(DecisionRow.id.desc()).offset(keep_last).limit(1)
            )
            if cutoff is None:
                return 0
            result = session.execute(delete(DecisionRow).where(DecisionRow.id <= cutoff))
            return int(getattr(result, "rowcount", 0) or 0)

    # ---- load history (what the forecasters learn from; survives restarts) -----
    def save_load_history(self, chunks: Sequence[tuple[str, float, list[list[float]]]]) -> None:
        """Write (policy, chunk start, samples) chunks: the samples replace those stored over the time they span,
        and the stored ones outside it stay (:func:`~controller.store.tables.spliced`)."""
        with self._session() as session:
            for policy, start_s, samples in chunks:
                stored = session.get(LoadHistoryRow, (policy, start_s), with_for_update=True)
                if stored is None:
                    session.add(LoadHistoryRow(policy=policy, chunk_start_s=start_s, samples=samples))
                else:
                    stored.samples = spliced(stored.samples, samples)

    def load_history(self, policy: str, *, since_s: float) -> list[list[float]]:
        """The policy's samples from chunks starting at or after ``since_s``, oldest first."""
        query = (
            select(LoadHistoryRow.samples)
            .where(LoadHistoryRow.policy == policy, LoadHistoryRow.chunk_start_s >= since_s)
            .order_by(LoadHistoryRow.chunk_start_s)
        )
        with self._session() as session:
            return [sample for samples in session.scalars(query).all() for sample in samples]

    def prune_load_history(self, *, before_s: float, keep_policies: Sequence[str] | None = None) -> int:
        """Delete chunks that started before ``before_s`` (and every chunk of policies not kept)."""
        with self._session() as session:
            removed = session.execute(delete(LoadHistoryRow).where(LoadHistoryRow.chunk_start_s < before_s))
            count = int(getattr(removed, "rowcount", 0) or 0)
            if keep_policies is not None:
                gone = session.execute(
                    delete(LoadHistoryRow).where(LoadHistoryRow.policy.not_in(list(keep_policies)))
                )
                count += int(getattr(gone, "rowcount", 0) or 0)
            return count

    @staticmethod
    def _record(row: DecisionRow) -> DecisionRecord:
        columns = {f.name: getattr(row, f.name) for f in fields(DecisionRecord)}
        return DecisionRecord(**{**columns, "at": _utc(row.at), "inputs": dict(row.inputs)})
