"""Modules stay under 500 lines and functions under 60, unless a ``# long: <why>`` comment says why.

The comment goes on the ``def`` line or on the line just above it (above the decorators too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "contracts", "engine", "exporters", "controller", "router", "generators", "harness", "stack", "bench", "cli",
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_MARK = "# long:"


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(path for top in PACKAGES if (root / top).is_dir() for path in (root / top).rglob("*.py"))


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """Functions over the limit without a ``# long:`` reason, as ``file:line name (n lines)``."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        marked = [lines[node.lineno - 1], lines[first - 2] if first >= 2 else ""]
        if not any(LONG_MARK in line for line in marked):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_modules_stay_under_500_lines() -> None:
    paths = modules()
    assert len(paths) > 150
    offenders = [f"{p.relative_to(ROOT)} ({n} lines)" for p in paths
                 if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]  # fmt: skip
    assert not offenders, "split these by responsibility: " + ", ".join(offenders)


def test_long_functions_say_why() -> None:
    offenders = [entry for path in modules() for entry in long_functions(path)]
    assert not offenders, "split these, or say why not with '# long: <why>':\n" + "\n".join(offenders)


def test_the_check_sees_a_long_function_and_its_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    bad = tmp_path / "bad.py"
    bad.write_text(f"def too_long():\n{body}\n\n# long: one hot loop\n@staticmethod\ndef fine():\n{body}")
    assert long_functions(bad, tmp_path) == [f"bad.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)"]
