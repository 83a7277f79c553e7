"""One step of the live rebalancer (applied, advisory, failed, verified...) as the decision log records it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from controller.rebalance import RebalanceDecision, VerifyResult


@dataclass(frozen=True, slots=True, kw_only=True)
class RebalanceEvent:
    """One rebalancer outcome for the decision log."""

    policy: str
    endpoint: str
    kind: Literal["rebalance", "verify"]
    outcome: Literal["applied", "advisory", "failed", "verified", "unverified", "interrupted"]
    """``interrupted``: a shutdown cut the apply short; whether the engine took the placement is unknown."""
    decision: RebalanceDecision | None
    plan: dict[str, Any] | None
    """Imbalance before/after (predicted), moves, plan time."""
    swap: dict[str, Any] | None = None
    verify: VerifyResult | None = None
    error: str | None = None

    def detail(self) -> str:
        """One line for the decision log: the prediction on the windows planned from, the held-out one the
        trigger and verification use where there is one, and what was measured."""
        plan = self.plan or {}
        text = (f"{self.endpoint}: predicted worst-layer CV {plan.get('imbalance_before_cv', 0):.3f} -> "
                f"{plan.get('imbalance_after_cv', 0):.3f}")
        held_out = plan.get("held_out")
        if held_out is not None:
            text += (f" ({held_out['worst_cv_before']:.3f} -> {held_out['worst_cv_after']:.3f} on a window "
                     "it was not planned from)")
        text += f", {plan.get('moves', 0)} expert moves"
        if plan.get("windows_from"):
            text += f"; planned on {plan['windows_from']}'s load history (this engine had too little of its own)"
        if self.verify is not None and self.verify.measured_cv is not None:
            text += f"; expected {self.verify.predicted_cv:.3f}, measured {self.verify.measured_cv:.3f}"
        if self.error:
            text += f"; {self.error}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "endpoint": self.endpoint,
            "kind": self.kind,
            "outcome": self.outcome,
            "decision": None if self.decision is None else self.decision.to_json(),
            "plan": self.plan,
            "swap": self.swap,
            "verify": None if self.verify is None else self.verify.to_json(),
            "error": self.error,
        }


__all__ = ["RebalanceEvent"]
