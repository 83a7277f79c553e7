"""Policy files as users write them: YAML's own readings of unquoted words."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ValidationError
from controller.policy import Mode
from controller.policy_files import load_policies


def test_an_unquoted_mode_off_is_the_off_mode(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML) reads an unquoted `off` as false; the policy meant "off".
    path = tmp_path / "p.yaml"
    path.write_text("name: quiet\ntarget: {kind: local, model: q}\nmode: off\n---\nname: loud\ntarget: {kind: local}\n")
    quiet, loud = load_policies(path)
    assert (quiet.mode, loud.mode) == (Mode.OFF, Mode.ENFORCE)


def test_two_policies_of_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    """The later one silently replaced the earlier (in ``policy apply`` and in the generators)."""
    path = tmp_path / "p.yaml"
    model = "target: {kind: model, model: m}"
    path.write_text(f"name: chat\n{model}\n---\nname: batch\ntarget: {{kind: model, model: n}}\n---\n"
                    f"name: chat\n{model}\nmode: off\n")
    with pytest.raises(ValidationError) as caught:
        load_policies(path)
    assert caught.value.problems == (f"{path}[2].name: policy 'chat' is defined twice (also at [0])",)


def test_two_policies_of_one_model_are_refused_naming_both(tmp_path: Path) -> None:
    """Their SLIs, load and alerts are read per model_name: each would see the other's traffic and page with it."""
    path = tmp_path / "p.yaml"
    path.write_text("name: team-a\ntarget: {kind: local}\n---\nname: other\ntarget: {kind: model, model: x}\n---\n"
                    "name: team-b\ntarget: {kind: deployment, namespace: prod, name: moeslo-qwen3-moe}\n")
    with pytest.raises(ValidationError) as caught:
        load_policies(path)
    assert caught.value.problems == (
        f"{path}[2].target.model: model 'moeslo-qwen3-moe' is watched by policy 'team-a' (at [0]) already: policy "
        "'team-b' cannot watch it too (one policy a model; give 'team-b' another target.model, or change or delete "
        "'team-a')",
    )
