"""Shared fixtures: paths to shared data, a small random checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.datadir import default_data_dir

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = default_data_dir()


def shared_data(*parts: str) -> Path:
    """A path under the shared data folder; skips the test cleanly when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


@pytest.fixture(autouse=True)
def _default_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands run in-process (typer's runner) leave glibc's allocator as it is: the setting
    :mod:`controller.rebalance.allocator` applies is process-wide and would reach every later test."""
    monkeypatch.setattr("controller.rebalance.allocator.keep_freed_memory", lambda: False)


@pytest.fixture(autouse=True)
def _default_switch_interval() -> Iterator[None]:
    """``controller serve`` run in-process shortens the switch interval (process-wide): later tests get it back."""
    interval_s = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval_s)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small random Qwen3-MoE checkpoint in the Hugging Face format."""
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    out = tmp_path_factory.mktemp("ckpt")
    config = ModelConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=512,
    )
    init_random_checkpoint(out, config, seed=0)
    yield out
