"""What the store hands out (policies with their versions, history, decisions) and the errors of its writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts.errors import ConflictError, DataError, ValidationError
from controller.policy import Policy, model_held_problem


class StaleVersionError(ConflictError):
    """A conditional write named a version the policy no longer has (HTTP 412)."""

    def __init__(self, name: str, *, current: int | None, expected: int | None) -> None:
        """``expected`` None: any version (``If-Match: *``), which a policy that does not exist has not."""
        self.name = name
        self.current = current
        self.expected = expected
        now = "does not exist" if current is None else f"is at version {current}"
        if expected is None:
            super().__init__(f"policy {name!r} {now}: If-Match: * needs a current version")
        else:
            super().__init__(f"policy {name!r} {now}, not version {expected} (it changed since it was read)")


class PolicyExistsError(ConflictError):
    """A create found the name taken (HTTP 409), in the write's own transaction."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"policy {name!r} already exists")


class ModelHeldError(ConflictError):
    """Another policy watches the model a policy names (HTTP 409): the SLIs, the load and the alerts are read per
    model, so each would see the other's traffic and page with it."""

    def __init__(self, model: str, *, holder: str, policy: str) -> None:
        self.model = model
        self.holder = holder
        self.policy = policy
        super().__init__(model_held_problem(model, holder, policy))


class UnreadablePolicyError(DataError):
    """A stored policy this version cannot read: written before a rule was tightened, or by a newer version with
    a field this one does not know (after a rollback).  It is left out of the listing, so the others keep
    running; replacing it (PUT) or deleting it needs no reading of it."""

    def __init__(self, name: str, version: int, problem: str) -> None:
        self.name = name
        self.version = version
        self.problem = problem
        super().__init__(f"policy {name!r} as stored (version {version}) no longer validates: {problem}; "
                         "replace it (PUT) or delete it")  # fmt: skip


class DecisionRefusedError(ValidationError):
    """The database refused a decision record for what it holds (a column's rule broken, inputs its JSON column
    cannot encode): written again, it fails again, unlike a write an outage failed."""


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    """A policy with its version and timestamps."""

    policy: Policy
    version: int
    created_at: datetime
    updated_at: datetime

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    name: str
    version: int
    operation: str
    spec: dict[str, Any] | None
    at: datetime


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One row of the decision log (``id`` is None until stored)."""

    policy: str
    policy_version: int
    at: datetime
    tick_s: float
    action: str
    reason: str
    current_replicas: int | None
    desired_replicas: int | None
    mode: str
    outcome: str
    detail: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    id: int | None = None


@dataclass(frozen=True, slots=True)
class UnreadablePolicy:
    """A stored policy left out of the listing, and why (:class:`UnreadablePolicyError`)."""

    name: str
    version: int
    problem: str

    def error(self) -> UnreadablePolicyError:
        return UnreadablePolicyError(self.name, self.version, self.problem)
