"""Policy files as users write them: YAML's own readings of unquoted words."""

from __future__ import annotations

from pathlib import Path

from controller.policy import Mode
from controller.policy_files import load_policies


def test_an_unquoted_mode_off_is_the_off_mode(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML) reads an unquoted `off` as false; the policy meant "off".
    path = tmp_path / "p.yaml"
    path.write_text("name: quiet\ntarget: {kind: local}\nmode: off\n---\nname: loud\ntarget: {kind: local}\n")
    quiet, loud = load_policies(path)
    assert (quiet.mode, loud.mode) == (Mode.OFF, Mode.ENFORCE)
