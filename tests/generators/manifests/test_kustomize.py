"""A broken kustomization or resource file ends ``deploy render`` and ``deploy build`` in one ``error:`` line
naming the file (and the line of a YAML error), exit status 2: never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contracts.errors import DataError
from generators.manifests import build

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
OVERLAY = Path("overlays") / "vllm-gpu"


@pytest.fixture(autouse=True)
def _without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_DEBUG", raising=False)


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    return tmp_path / "deploy"


def _run(*args: str) -> tuple[int, list[str]]:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.splitlines()


@pytest.mark.parametrize("command", ["render", "build"])
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("resources: [\n",
         ":2: invalid YAML: expected the node content, but found '<stream end>' (while parsing a flow node)"),
        ("resources: 5\n", ": resources must be a list of paths, got a number"),
        ("resources: [vllm.yaml, {a: 1}]\n", ": resources[1] must be a path, got a mapping"),
        ("- vllm.yaml\n", ": a kustomization must be a mapping, got a list"),
        ("resources: [vllm.yaml]\n---\nresources: [hpa.yaml]\n", ": a kustomization is one YAML document, found 2"),
    ],
)
def test_a_broken_overlay_kustomization_is_one_error_line(deploy_copy: Path, command: str, text: str,
                                                          says: str) -> None:
    kustomization = deploy_copy / OVERLAY / "kustomization.yaml"
    kustomization.write_text(text)
    args = ["render", "--dir", str(deploy_copy)] if command == "render" else ["build", "vllm-gpu", "--dir",
                                                                               str(deploy_copy)]
    code, lines = _run("deploy", *args)
    assert (code, lines) == (2, [f"error: {kustomization}{says}"])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("resources: [.]\n", "includes itself through its resources (a cycle)"),
        ("resources: [vllm.yaml]\npatches: 5\n", "patches must be a list of mappings, got a number"),
        ("resources: [vllm.yaml]\npatches: [{path: 5}]\n",
         "only `patches: - path: FILE` is supported, got {'path': 5}"),
        ("resources: [vllm.yaml]\nlabels: [{pairs: 3}]\n", "only `labels: - pairs: {NAME: VALUE}` is supported"),
        ("resources: [vllm.yaml]\nimages: [nginx]\n", "images[0] must be a mapping, got a string"),
        ("resources: [vllm.yaml]\nnamespace: [a]\n", "namespace must be a string, got a list"),
    ],
)
def test_build_refuses_what_its_kustomize_cannot_apply(deploy_copy: Path, text: str, says: str) -> None:
    kustomization = deploy_copy / OVERLAY / "kustomization.yaml"
    kustomization.write_text(text)
    code, lines = _run("deploy", "build", "vllm-gpu", "--dir", str(deploy_copy))
    assert (code, lines) == (2, [f"error: {kustomization}: {says}"])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: Deployment\nmetadata: {name: [\n",
         ":3: invalid YAML: expected the node content, but found '<stream end>' (while parsing a flow node)"),
        ("kind: Deployment\n---\njust a string\n",
         ": document 2 must be a mapping (a Kubernetes object), got a string"),
    ],
)
def test_a_broken_resource_file_is_one_error_line(deploy_copy: Path, text: str, says: str) -> None:
    resource = deploy_copy / OVERLAY / "hpa.yaml"
    resource.write_text(text)
    for args in (["render", "--dir", str(deploy_copy)], ["build", "vllm-gpu", "--dir", str(deploy_copy)]):
        code, lines = _run("deploy", *args)
        assert (code, lines) == (2, [f"error: {resource}{says}"]), args


def test_an_empty_resources_key_is_no_resources(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\ncomponents:\nnamespace: moeslo\n")
    assert build(tmp_path) == []


def test_a_yaml_error_is_one_line_with_the_line_number(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - a.yaml\n bad: [\n")
    with pytest.raises(DataError) as raised:
        build(tmp_path)
    assert raised.value.line == 3
    assert "\n" not in str(raised.value)
