"""``moeslo model init`` writes a checkpoint with a trained tokenizer and a chat template (or without);
sizes that memory cannot hold are refused before anything is allocated or written."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner, Result


def invoke(*args: str) -> Result:
    from cli.main import app

    return CliRunner().invoke(app, list(args))


SMALL = ["--layers", "1", "--hidden", "32", "--experts", "4", "--top-k", "2", "--moe-intermediate", "16",
         "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--vocab", "600", "--max-positions", "128"]


def test_model_init_writes_tokenizer_and_chat_template(tmp_path: Path) -> None:
    result = invoke("model", "init", "--out", str(tmp_path / "a"), *SMALL, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["tokenizer"] is True
    tokenizer = json.loads((tmp_path / "a" / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) == 600
    config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"] and config["model_max_length"] == 128
    # <|endoftext|> ends a sequence, named alike for the engine, vLLM and transformers.
    eos = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")
    assert config["eos_token"] == "<|endoftext|>"
    assert json.loads((tmp_path / "a" / "config.json").read_text())["eos_token_id"] == eos
    assert json.loads((tmp_path / "a" / "generation_config.json").read_text())["eos_token_id"] == eos
    again = invoke("model", "init", "--out", str(tmp_path / "b"), *SMALL)
    assert again.exit_code == 0, again.output
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == (tmp_path / "a" / "tokenizer.json").read_bytes()


def test_model_init_without_tokenizer(tmp_path: Path) -> None:
    result = invoke("model", "init", "--out", str(tmp_path), *SMALL, "--no-tokenizer")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "config.json").is_file()
    assert not (tmp_path / "tokenizer.json").exists() and not (tmp_path / "tokenizer_config.json").exists()


def test_a_size_no_memory_holds_is_refused_before_allocating(tmp_path: Path) -> None:
    out = tmp_path / "huge"
    started = time.monotonic()
    result = invoke("model", "init", "--out", str(out), "--vocab", "10000000000", "--no-tokenizer", "--layers", "1")
    assert result.exit_code == 2, result.output
    assert time.monotonic() - started < 30  # refused, not attempted
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "--vocab" in result.output and "TiB of memory" in result.output and "available" in result.output
    assert not out.exists()


def test_the_memory_check_uses_what_is_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 1024))
    result = invoke("model", "init", "--out", str(tmp_path / "a"), *SMALL, "--no-tokenizer")
    assert result.exit_code == 2 and "64.0 KiB is available" in result.output
    assert not (tmp_path / "a").exists()


def test_a_failed_allocation_is_one_error_line_and_leaves_no_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.checkpoint

    def refuse(*_: Any, **__: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 81920000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(engine.checkpoint, "_random_tensors", refuse)
    new = tmp_path / "new" / "ckpt"
    result = invoke("model", "init", "--out", str(new), *SMALL, "--no-tokenizer")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: not enough memory") and result.output.count("\n") == 1
    assert "81920000000 bytes" in result.output
    assert not (tmp_path / "new").exists()
    # A folder that was there before stays, with what it held.
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    result = invoke("model", "init", "--out", str(kept), *SMALL, "--no-tokenizer")
    assert result.exit_code == 2 and (kept / "notes.txt").read_text() == "mine"


def test_a_vocabulary_too_small_for_a_tokenizer_says_so(tmp_path: Path) -> None:
    args = [*SMALL[:-4], "--max-positions", "128"]
    assert "--vocab" not in args
    result = invoke("model", "init", "--out", str(tmp_path / "a"), *args, "--vocab", "256")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "a" / "tokenizer.json").exists()
    note = [line for line in result.output.splitlines() if "tokenizer" in line]
    assert len(note) == 1 and "--vocab 260" in note[0] and "byte-level" in note[0]
    quiet = invoke("model", "init", "--out", str(tmp_path / "b"), *args, "--vocab", "256", "--no-tokenizer")
    assert quiet.exit_code == 0 and "tokenizer" not in quiet.output


@pytest.mark.parametrize("vocab", ["1", "100", "255"])
def test_a_vocabulary_below_one_id_per_byte_is_refused_before_anything_is_written(tmp_path: Path, vocab: str) -> None:
    """``--vocab 100`` wrote a checkpoint that ``moeslo serve`` then refused (its byte-level tokenizer needs an
    id for each of the 256 bytes)."""
    result = invoke("model", "init", "--out", str(tmp_path / "a"), *SMALL[:-4], "--vocab", vocab)
    assert result.exit_code == 2
    assert "--vocab" in result.output and "256 or more" in " ".join(result.output.split())
    assert not (tmp_path / "a").exists()


def test_model_help_names_what_there_is() -> None:
    result = invoke("model", "--help")
    assert result.exit_code == 0
    assert "inspect" not in result.output and "init" in result.output
