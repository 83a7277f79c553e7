"""A text file the user names is read, or refused in one line that names it: bytes that are not UTF-8, bad YAML.

Every command that reads such a file says so the same way (``moeslo`` exits 2 with one ``error:`` line).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from contracts.errors import DataError
from contracts.text_files import read_text, yaml_error

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "harness" / "data" / "AzureLLMInferenceTrace_conv_15min.csv"

NOT_UTF8 = b'{"name": "a",\n"\xe0": 1}\n'
"""Latin-1 (``à``) on line 2."""
BAD_YAML = b"name: a\nmodel: [x,\n"
"""A flow list never closed: PyYAML's message runs over six lines, the line quoted with a caret under it."""


@pytest.fixture(autouse=True)
def _without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_DEBUG", raising=False)


def _overlay(tmp_path: Path, content: bytes) -> tuple[list[str], Path]:
    deploy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", deploy)
    policies = deploy / "overlays" / "vllm-gpu" / "policies.yaml"
    policies.write_bytes(content)
    return ["deploy", "render", "--dir", str(deploy)], policies


def _given(command: str) -> Callable[[Path, bytes], tuple[list[str], Path]]:
    """A command line reading the file that ``{file}`` stands for (``{tmp}``: the test's folder)."""

    def build(tmp_path: Path, content: bytes) -> tuple[list[str], Path]:
        file = tmp_path / "given.yaml"
        file.write_bytes(content)
        (tmp_path / "load.csv").write_text("1,2\n3,4\n")
        argv = command.format(file=file, tmp=tmp_path, trace=TRACE).split()
        return argv, file

    return build


YAML_READERS = {
    "alerts": _given("alerts generate --out {tmp}/out --policies {file}"),
    "dashboards": _given("dashboards generate --out {tmp}/out --policies {file}"),
    "policy-apply": _given("policy apply -f {file} --url http://127.0.0.1:9"),
    "controller-config": _given("controller serve --config {file} --db {tmp}/c.db --port 0"),
    "deploy-overlay": _overlay,
}
JSON_READERS = {
    "replay-profile": _given("replay --trace {trace} --profile {file} --out {tmp}/r --policies static --duration 60"),
    "rebalance-previous": _given("rebalance --load {tmp}/load.csv --previous {file} --ranks 2 --slots-per-rank 1 "
                                 "--out {tmp}/p.json"),
}


def _moeslo(argv: list[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, argv)
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [*YAML_READERS.values(), *JSON_READERS.values()],
                         ids=[*YAML_READERS, *JSON_READERS])  # fmt: skip
def test_a_file_that_is_not_utf8_is_named_with_its_line(
    tmp_path: Path, command: Callable[[Path, bytes], tuple[list[str], Path]]
) -> None:
    """It said ``'utf-8' codec can't decode byte 0xe0 in position 15: invalid continuation byte``, of no file."""
    argv, file = command(tmp_path, NOT_UTF8)
    code, output = _moeslo(argv)
    lines = output.splitlines()  # replay draws its progress bar first
    assert code == 2 and lines[-1] == f"error: {file}:2: not a UTF-8 text file (byte 0xe0)", output
    assert sum("error" in line for line in lines) == 1


@pytest.mark.parametrize("command", YAML_READERS.values(), ids=YAML_READERS)
def test_invalid_yaml_is_one_line(tmp_path: Path, command: Callable[[Path, bytes], tuple[list[str], Path]]) -> None:
    argv, file = command(tmp_path, BAD_YAML)
    code, output = _moeslo(argv)
    assert code == 2 and output.count("\n") == 1, output
    assert output.startswith(f"error: {file}:3: invalid YAML: expected the node content, but found '<stream end>'")


def test_read_text_drops_a_byte_order_mark_and_names_what_it_cannot_read(tmp_path: Path) -> None:
    marked = tmp_path / "p.json"
    marked.write_bytes(b'\xef\xbb\xbf{"a": 1}')  # Notepad's UTF-8
    assert read_text(marked) == '{"a": 1}'
    with pytest.raises(DataError, match=r"^.*missing\.json: cannot read profile: No such file or directory$"):
        read_text(tmp_path / "missing.json", what="profile")
    with pytest.raises(DataError, match=r": cannot read: Is a directory$"):
        read_text(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,2\n3,\xff\n")
    with pytest.raises(DataError, match=r"bad\.csv:3: not a UTF-8 text file \(byte 0xff\)$"):
        read_text(bad)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: a\n  mode: off\n", "x.yaml:2: invalid YAML: mapping values are not allowed here"),
        ('a: "open\n\nb: 2\n', "x.yaml:4: invalid YAML: found unexpected end of stream "
                               "(while scanning a quoted scalar from line 1)"),
        ("a: 1\nb: \x07\n", "x.yaml:2: invalid YAML: unacceptable character #x0007: special characters are "
                            "not allowed"),
        ("a: 1\n- b\n", "x.yaml:2: invalid YAML: expected <block end>, but found '-' "
                        "(while parsing a block mapping from line 1)"),
    ],
)
def test_yaml_errors_are_one_line_with_the_file_and_line(text: str, says: str) -> None:
    with pytest.raises(yaml.YAMLError) as raised:
        list(yaml.safe_load_all(text))
    error = yaml_error(raised.value, "x.yaml", text)
    assert str(error) == says and error.path == "x.yaml"
