"""``moeslo model init`` writes a checkpoint with a trained tokenizer and a chat template (or without)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

SMALL = ["--layers", "1", "--hidden", "32", "--experts", "4", "--top-k", "2", "--moe-intermediate", "16",
         "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--vocab", "600", "--max-positions", "128"]


def test_model_init_writes_tokenizer_and_chat_template(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "init", "--out", str(tmp_path / "a"), *SMALL, "--json"])
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
    again = CliRunner().invoke(app, ["model", "init", "--out", str(tmp_path / "b"), *SMALL])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == (tmp_path / "a" / "tokenizer.json").read_bytes()


def test_model_init_without_tokenizer(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "init", "--out", str(tmp_path), *SMALL, "--no-tokenizer"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "config.json").is_file()
    assert not (tmp_path / "tokenizer.json").exists() and not (tmp_path / "tokenizer_config.json").exists()
