"""SLO policies read from a YAML/JSON file, and the mission's default policy.

A policies file holds one policy per YAML document (what ``moeslo policy
apply -f`` reads), a list of policies, or a mapping with a ``policies`` list;
each entry in the REST API's shape (:class:`Policy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import DataError, ValidationError
from contracts.slo_defaults import (
    COMPLIANCE_WINDOW,
    ITL_THRESHOLD_S,
    LATENCY_TARGET,
    MAX_IMBALANCE_CV,
    TTFT_THRESHOLD_S,
)
from contracts.text_files import read_text, yaml_error
from controller.policy import LocalTarget, Policy, parse_duration_s, shared_model_problems

DEFAULT_POLICIES: tuple[Policy, ...] = (
    Policy(
        name="moeslo-qwen3-moe",
        description=(
            f"The mission's SLOs: TTFT <= {TTFT_THRESHOLD_S * 1000:g} ms and ITL <= {ITL_THRESHOLD_S * 1000:g} ms "
            f"for {LATENCY_TARGET * 100:g} %, expert CV <= {MAX_IMBALANCE_CV:g}, "
            f"{parse_duration_s(COMPLIANCE_WINDOW) // 86_400} days."
        ),
        target=LocalTarget(),
    ),
)
"""The committed alerts, dashboards and manifests are generated from these."""


def policy_items(document: Any, *, source: str = "policies") -> list[Any]:
    """The policies of a parsed document, not yet validated: one policy, a list of them, or a mapping with a
    ``policies`` list (several YAML documents of a file come as a list)."""
    if isinstance(document, dict) and "name" in document:
        document = [document]
    items = document.get("policies") if isinstance(document, dict) else document
    if not isinstance(items, list):
        raise ValidationError(f"{source}: expected a list of policies or a mapping with a 'policies' list")
    # YAML 1.1 (PyYAML) reads an unquoted `mode: off` as false; a policy file meant "off" (the API, which
    # takes JSON, refuses false as its schema says).
    return [{**item, "mode": "off"} if isinstance(item, dict) and item.get("mode") is False else item
            for item in items]  # fmt: skip


def parse_policies(document: Any, *, source: str = "policies") -> tuple[Policy, ...]:
    """Policies from a parsed YAML/JSON document; every invalid field is reported at once."""
    items = policy_items(document, source=source)
    problems: list[str] = []
    valid: dict[int, Policy] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        try:
            policy = valid[index] = Policy.model_validate(item)
        except PydanticValidationError as exc:
            problems.extend(
                f"{source}[{index}].{'.'.join(str(part) for part in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            continue
        if policy.name in first:  # the later one would silently replace the earlier
            problems.append(
                f"{source}[{index}].name: policy {policy.name!r} is defined twice (also at [{first[policy.name]}])"
            )
        first.setdefault(policy.name, index)
    problems.extend(shared_model_problems(valid, source=source))
    if problems:
        raise ValidationError(problems)
    return tuple(valid.values())


def read_documents(path: str | Path) -> list[Any]:
    """Every non-empty YAML (or JSON) document of a file; DataError names the file and line."""
    text = read_text(path)
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path, text) from exc


def load_policies(path: str | Path) -> tuple[Policy, ...]:
    """Policies from a file (YAML or JSON); at least one (rules or dashboards of none would watch nothing)."""
    documents = read_documents(path)
    policies = parse_policies(documents[0] if len(documents) == 1 else documents, source=str(path)) if documents else ()
    if not policies:
        raise DataError("no policies in the file", path=str(path))
    return policies


def dump_policies(policies: Sequence[Policy]) -> list[dict[str, Any]]:
    """Policies as plain data (what :func:`parse_policies` reads back)."""
    return [policy.model_dump(mode="json") for policy in policies]


__all__ = ["DEFAULT_POLICIES", "dump_policies", "load_policies", "parse_policies", "policy_items", "read_documents"]
