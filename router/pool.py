"""The replicas' live state: last scrape, the router's own in-flight counts, ejection and readmission.

The one mutable object of the router (the policies only read its
:meth:`ReplicaPool.snapshot`).  Everything runs on the event loop's thread,
so no locks.  The scraped queue lags by up to a scrape interval; the
router's own counts do not, so a replica's waiting and running are the
larger of the two, and its pending prefill tokens are the router's own
unstarted prompts plus the scraped queue the router did not send, at an
assumed mean length.  A request answered whole (not streamed) shows no
first token: the scraped queue says when it started (:meth:`ReplicaPool.update_load`).
The replicas' prefill rate starts at the configured
one and follows the observed TTFT of streamed requests (:meth:`calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from router.scrape import ScrapedLoad
from router.types import ReplicaState

CALIBRATION_STEP = 0.2
MIN_CALIBRATED_S = 0.05
RATE_RANGE = 100.0


@dataclass(slots=True)
class _Replica:
    name: str
    prefill_tokens_per_s: float
    healthy: bool = True
    passes: int = 0
    """Consecutive passed health checks while ejected."""
    silent: int = 0
    """Consecutive /metrics scrapes that timed out while live."""
    failures: int = 0
    """Consecutive answers with a server error while live (ejection and readmission do not end the run)."""
    load: ScrapedLoad = field(default_factory=ScrapedLoad)
    outstanding: int = 0
    prefilling: int = 0
    prefill_tokens: int = 0
    ejections: int = 0
    unstarted: dict[int, Ticket] = field(default_factory=dict)
    """Its tickets without a first token, by :attr:`Ticket.seq` (so oldest first)."""
    scraped_after: int = 0
    """The pool's :attr:`ReplicaPool.begun` when its last scrape that answered was sent."""


@dataclass(slots=True)
class Ticket:
    """One request in flight on one replica (its counts leave the pool exactly once)."""

    replica: str
    prompt_tokens: int
    seq: int = 0
    """Its place in the order the pool's tickets began (from 1)."""
    streamed: bool = True
    """False: the answer comes whole, so its first token shows only in the replica's scraped queue."""
    started: bool = False
    finished: bool = False
    record: _Replica | None = field(default=None, repr=False, compare=False)
    """The replica's record it began on: one removed and listed again is a new record its counts stay off."""


class ReplicaPool:
    def __init__(self, names: tuple[str, ...], *, prefill_tokens_per_s: float, mean_prompt_tokens: float,
                 readmit_after: int = 2, eject_after_silent: int = 10, eject_after_5xx: int = 5) -> None:  # fmt: skip
        self._replicas = {name: _Replica(name, prefill_tokens_per_s) for name in names}
        self.configured_rate = prefill_tokens_per_s
        self.rate = prefill_tokens_per_s
        """The calibrated prefill rate every replica is predicted with."""
        self.mean_prompt_tokens = mean_prompt_tokens
        self.readmit_after = readmit_after
        self.eject_after_silent = eject_after_silent
        self.eject_after_5xx = eject_after_5xx
        self.begun = 0
        """Tickets begun so far (the last one's ``seq``): a scrape sent now is newer than each of them."""
        self.on_change: Callable[[], None] = _nothing
        """Called when a replica may take more than before (a request finished or began its answer, a scrape, a
        readmission, a faster rate): the router's held requests look again."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._replicas)

    def is_healthy(self, name: str) -> bool:
        replica = self._replicas.get(name)
        return replica is not None and replica.healthy

    def set_members(self, names: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """Make ``names`` the replica set; returns (added, removed).

        An added replica starts as an ejected one does: it takes requests once it has passed
        ``readmit_after`` health checks in a row (a replica the controller just started is
        listed before its engine is ready).
        A removed replica's requests in flight finish normally: their tickets' counts
        then have nowhere to go and are dropped (:meth:`first_token`, :meth:`finish`).
        """
        added = [n for n in names if n not in self._replicas]
        removed = [n for n in self._replicas if n not in names]
        for name in removed:
            del self._replicas[name]
        for name in added:
            self._replicas[name] = _Replica(name, self.rate, healthy=False)
        return added, removed

    def snapshot(self) -> tuple[ReplicaState, ...]:
        return tuple(self._state(r) for r in self._replicas.values())

    def _state(self, r: _Replica) -> ReplicaState:
        scraped_waiting = int(r.load.waiting or 0)
        unseen_waiting = max(0, scraped_waiting - r.prefilling)
        return ReplicaState(
            name=r.name, healthy=r.healthy, waiting=max(scraped_waiting, r.prefilling),
            running=max(int(r.load.running or 0), r.outstanding - r.prefilling), kv_usage=r.load.kv_usage or 0.0,
            pending_prefill_tokens=r.prefill_tokens + int(unseen_waiting * self.mean_prompt_tokens),
            outstanding=r.outstanding, prefill_tokens_per_s=r.prefill_tokens_per_s,
        )

    def begin(self, name: str, prompt_tokens: int, *, streamed: bool = True) -> Ticket:
        """A request sent to ``name``; ``streamed=False``: no byte comes back before its whole answer, so its
        prefill counts as done once the scraped queue leaves it out (:meth:`update_load`)."""
        r = self._replicas[name]
        r.outstanding += 1
        r.prefilling += 1
        r.prefill_tokens += prompt_tokens
        self.begun += 1
        ticket = Ticket(name, prompt_tokens, seq=self.begun, streamed=streamed, record=r)
        r.unstarted[ticket.seq] = ticket
        return ticket

    def _record_of(self, ticket: Ticket) -> _Replica | None:
        r = self._replicas.get(ticket.replica)
        return r if r is ticket.record else None

    def first_token(self, ticket: Ticket) -> None:
        if ticket.started or ticket.finished:
            return
        ticket.started = True
        r = self._record_of(ticket)
        if r is None:
            return
        r.prefilling -= 1
        r.prefill_tokens -= ticket.prompt_tokens
        del r.unstarted[ticket.seq]
        self.on_change()

    def finish(self, ticket: Ticket) -> bool:
        """End the ticket; whether its replica's record still counted it (False: gone, or listed anew since)."""
        if ticket.finished:
            return False
        self.first_token(ticket)
        ticket.finished = True
        if (r := self._record_of(ticket)) is None:
            return False
        r.outstanding -= 1
        self.on_change()
        return True

    def calibrate(self, name: str, predicted_s: float, observed_s: float) -> None:
        """Move the fleet's prefill rate toward what an observed TTFT says (a step in log space).

        A prediction is proportional to 1 / rate, so ``rate x predicted / observed`` would have
        predicted what was observed; the rate moves ``CALIBRATION_STEP`` of the way there (in
        log space, each step's ratio clamped to 0.5..2), and stays within ``RATE_RANGE`` of the
        configured rate.  Predictions under ``MIN_CALIBRATED_S`` are skipped: there the network and
        the router's own hop, not prefill, make the TTFT.

        One rate for every replica: the replicas behind one router run one workload on one kind
        of machine, and a rate learned per replica only from the requests it is sent is a trap:
        the favoured replica's rate is the only one that moves, so once it drifts up the others
        are never tried again (measured: 178 of 182 requests to one of two replicas).  A slow
        replica still shows in its own queue and running batch.
        """
        if name not in self._replicas or predicted_s < MIN_CALIBRATED_S or observed_s <= 0:
            return
        ratio = min(2.0, max(0.5, predicted_s / observed_s))
        low, high = self.configured_rate / RATE_RANGE, self.configured_rate * RATE_RANGE
        self.rate = min(high, max(low, self.rate * ratio**CALIBRATION_STEP))
        for replica in self._replicas.values():
            replica.prefill_tokens_per_s = self.rate
        self.on_change()

    def update_load(self, name: str, load: ScrapedLoad, *, begun_before: int | None = None) -> None:
        """A scrape of ``name``; ``begun_before``: :attr:`begun` when it was sent.

        A whole-answer request (no byte before it is done) counts as started once a scrape shows fewer waiting
        than the router's own unstarted requests of that replica: the engine serves first come, first served,
        so the oldest of them are running. Only those begun before the replica's previous scrape are judged
        (a scrape interval for the request to reach the engine's queue and its metrics); streamed ones among
        them count, their first token still on its way, but say started only when it comes.
        """
        r = self._replicas.get(name)
        if r is None:
            return
        r.load = load
        if begun_before is not None:
            if load.waiting is not None:
                old = [t for t in r.unstarted.values() if t.seq <= r.scraped_after]
                for ticket in old[: max(0, len(old) - int(load.waiting))]:
                    if not ticket.streamed:
                        self.first_token(ticket)
            r.scraped_after = begun_before
        self.on_change()

    def scrape_answered(self, name: str) -> None:
        if (r := self._replicas.get(name)) is not None:
            r.silent = 0

    def scrape_timed_out(self, name: str) -> bool:
        """Count a live replica's silent scrape; True when it has been silent ``eject_after_silent`` times running."""
        r = self._replicas.get(name)
        if r is None or not r.healthy:
            return False
        r.silent += 1
        return r.silent >= self.eject_after_silent

    def answered(self, name: str, *, failed: bool) -> bool:
        """Count a live replica's answer (``failed``: a server error); True when ``eject_after_5xx`` failed in a row."""
        r = self._replicas.get(name)
        if r is None or not r.healthy:
            return False
        r.failures = r.failures + 1 if failed else 0
        return r.failures >= self.eject_after_5xx

    def eject(self, name: str) -> bool:
        """Take a replica out of routing until it passes its health checks; True when it was live."""
        r = self._replicas.get(name)
        if r is None:
            return False
        r.passes = r.silent = 0  # ``failures`` runs on: a readmitted replica's next server error ejects it again
        r.load = ScrapedLoad()
        if not r.healthy:
            return False
        r.healthy = False
        r.ejections += 1
        return True

    def health_result(self, name: str, ok: bool) -> bool:
        """Record an ejected replica's health check; True when this pass readmits it."""
        r = self._replicas.get(name)
        if r is None or r.healthy:
            return False
        r.passes = r.passes + 1 if ok else 0
        if r.passes >= self.readmit_after:
            r.healthy = True
            r.passes = 0
            self.on_change()
            return True
        return False


def _nothing() -> None:
    pass


__all__ = ["CALIBRATION_STEP", "MIN_CALIBRATED_S", "RATE_RANGE", "ReplicaPool", "Ticket"]
