"""Imports point one way: an AST scan of every module (imports inside functions too).

The layers, bottom up::

    contracts                        imports nothing of ours
    engine          -> contracts
    exporters       -> engine, contracts
    controller      -> contracts     (its pure decision modules import none of its adapters)
    generators      -> controller, contracts
    harness         -> contracts
    router          -> contracts     (its policies are pure: the replay may share them)
    stack           -> harness, engine, exporters, controller, generators, contracts
    bench           -> anything but cli and stack
    cli             -> anything; nothing imports cli

and no two modules import each other, directly or around a longer loop (``from
pkg import x`` counts as importing ``pkg/__init__.py``, which Python runs first).
Each failure names the file, the line and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "contracts", "engine", "exporters", "controller", "generators", "harness", "router", "stack", "bench", "cli",
)  # fmt: skip
ALLOWED: Mapping[str, frozenset[str]] = {
    "contracts": frozenset(),
    "engine": frozenset({"contracts"}),
    "exporters": frozenset({"engine", "contracts"}),
    "controller": frozenset({"contracts"}),
    "generators": frozenset({"controller", "contracts"}),
    "harness": frozenset({"contracts"}),
    "router": frozenset({"contracts"}),
    "stack": frozenset({"harness", "engine", "exporters", "controller", "generators", "contracts"}),
    "bench": frozenset({"contracts", "engine", "exporters", "controller", "generators", "harness", "router"}),
    "cli": frozenset(PACKAGES) - {"cli"},
}
PURE_CONTROLLER = ("core", "types", "policy", "slo", "advisors", "predictive", "capacity", "observation_checks",
                   "forecast", "rebalance")  # fmt: skip
CONTROLLER_ADAPTERS = ("api", "store", "sources", "actuators", "service", "leader", "replay", "telemetry")
ENGINE_FORBIDDEN_LIBRARIES = ("prometheus_client", "opentelemetry")
TESTS_MAY_IMPORT_FROM_CLI = ("cli.main",)
"""Tests drive the command line through its app (typer's runner), not through command modules."""


@dataclass(frozen=True)
class Import:
    source: str
    """The importing module."""
    file: str
    """Its path, relative to the scanned root."""
    line: int
    target: str
    """The imported module (``from m import f`` gives ``m`` and, when ``m.f`` is a module, ``m.f``)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.source} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file for every ``.py`` under ``packages``."""
    return {
        module_name(path, root): path
        for top in packages
        if (root / top).is_dir()
        for path in sorted((root / top).rglob("*.py"))
    }


def imports_of(name: str, path: Path, known: Mapping[str, Path], root: Path) -> Iterator[Import]:
    """Every import in the file, relative ones resolved, ``from m import sub`` also as ``m.sub``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    file = str(path.relative_to(root))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, file, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            yield Import(name, file, node.lineno, base)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    yield Import(name, file, node.lineno, f"{base}.{alias.name}")


def scan(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    known = find_modules(root, packages)
    return [imp for name, path in known.items() for imp in imports_of(name, path, known, root)]


def top(module: str) -> str:
    return module.partition(".")[0]


def layer_violations(imports: list[Import]) -> list[str]:
    """Imports of one of our packages that its layer may not see."""
    return [
        f"{imp}  ({top(imp.source)} may import only {', '.join(sorted(ALLOWED[top(imp.source)])) or 'nothing of ours'})"
        for imp in imports
        if top(imp.target) in ALLOWED and top(imp.target) != top(imp.source)
        and top(imp.target) not in ALLOWED[top(imp.source)]
    ]


def _is_under(module: str, prefixes: tuple[str, ...], package: str) -> bool:
    return any(module == f"{package}.{p}" or module.startswith(f"{package}.{p}.") for p in prefixes)


def pure_core_violations(imports: list[Import]) -> list[str]:
    """The controller's decision modules importing its I/O adapters."""
    return [
        f"{imp}  (a pure decision module imports an adapter)"
        for imp in imports
        if _is_under(imp.source, PURE_CONTROLLER, "controller") and _is_under(imp.target, CONTROLLER_ADAPTERS,
                                                                               "controller")
    ]


def engine_library_violations(imports: list[Import]) -> list[str]:
    """The engine records plain data: no exporter library in it."""
    return [
        f"{imp}  (the engine records; exporters translate)"
        for imp in imports
        if top(imp.source) == "engine" and top(imp.target) in ENGINE_FORBIDDEN_LIBRARIES
    ]


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set())
        if imp.target in {i.source for i in imports} and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe_cycle(component: list[str], imports: list[Import]) -> str:
    members = set(component)
    edges = [str(imp) for imp in imports if imp.source in members and imp.target in members
             and imp.source != imp.target]  # fmt: skip
    return "cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(sorted(set(edges)))


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    found = scan(ROOT)
    assert len({i.source for i in found}) > 150, "the scan found too few modules"
    return found


def test_packages_import_only_the_layers_below(imports: list[Import]) -> None:
    offenders = layer_violations(imports)
    assert not offenders, "\n".join(["imports against the layering:", *offenders])


def test_nothing_imports_cli(imports: list[Import]) -> None:
    offenders = [str(imp) for imp in imports if top(imp.target) == "cli" and top(imp.source) != "cli"]
    assert not offenders, "\n".join(["the command line is a leaf, yet:", *offenders])


def test_the_decision_core_imports_no_adapter(imports: list[Import]) -> None:
    offenders = pure_core_violations(imports)
    assert not offenders, "\n".join(offenders)


def test_engine_never_imports_exporter_libraries(imports: list[Import]) -> None:
    offenders = engine_library_violations(imports)
    assert not offenders, "\n".join(offenders)


def test_no_import_cycles(imports: list[Import]) -> None:
    found = cycles(imports)
    assert not found, "\n".join(describe_cycle(c, imports) for c in found)


def test_tests_use_the_command_line_through_its_app() -> None:
    known = find_modules(ROOT, ("tests",))
    offenders = [
        str(imp)
        for name, path in known.items()
        for imp in imports_of(name, path, known, ROOT)
        if top(imp.target) == "cli" and imp.target not in TESTS_MAY_IMPORT_FROM_CLI
    ]
    assert not offenders, "\n".join(offenders)


def test_the_scan_catches_planted_offenders(tmp_path: Path) -> None:
    files = {
        "engine/__init__.py": "",
        "engine/bad.py": "def f():\n    from prometheus_client import Counter\n    import exporters.sink\n",
        "exporters/__init__.py": "",
        "exporters/sink.py": "from cli.main import app\n",
        "controller/__init__.py": "",
        "controller/core.py": "from .api import routes\n",
        "controller/api/__init__.py": "from controller.api.routes import router\n",
        "controller/api/routes.py": "from controller.api import helpers\n",
        "controller/api/helpers.py": "X = 1\n",
        "cli/__init__.py": "",
        "cli/main.py": "app = None\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = scan(tmp_path)
    layering = "\n".join(layer_violations(found))
    assert "engine/bad.py:3: engine.bad imports exporters.sink" in layering
    assert "exporters/sink.py:1: exporters.sink imports cli.main" in layering
    core = "\n".join(pure_core_violations(found))
    assert "controller/core.py:1: controller.core imports controller.api.routes" in core
    assert "engine/bad.py:2: engine.bad imports prometheus_client" in "\n".join(engine_library_violations(found))
    # routes -> controller.api (the package __init__, run first) -> routes: a cycle through `from pkg import x`.
    assert cycles(found) == [["controller.api", "controller.api.routes"]]
