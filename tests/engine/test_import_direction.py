"""engine/ records plain data and never imports an exporter library (AST scan of engine/**.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FORBIDDEN = ("prometheus_client", "opentelemetry", "exporters")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_engine_never_imports_exporter_libraries() -> None:
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 5
    offenders = [
        f"{path.relative_to(ENGINE.parent)}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert offenders == []


def test_the_scan_catches_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from prometheus_client import Counter\n    import opentelemetry.trace\n")
    assert imported_modules(bad) == ["prometheus_client", "opentelemetry.trace"]
