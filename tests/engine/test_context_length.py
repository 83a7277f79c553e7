"""The served context (``max_model_len``): the checkpoint's by default, ``--max-model-len`` to choose it, a KV
budget that cannot hold it refused when asked for and a capped context said so when not."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import ValidationError
from engine import wire
from engine.core import EngineCore
from engine.engine_types import EngineConfig
from engine.errors import PromptTooLongError
from engine.protocol import fit_to_context
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from tests.engine.fake_executor import FakeExecutor


def _core(max_model_len: int | None = None, *, num_blocks: int = 4096, block_size: int = 16,
          max_len: int = 32768) -> EngineCore:
    executor = FakeExecutor(num_blocks=num_blocks, block_size=block_size, max_len=max_len)
    return EngineCore(executor, EngineConfig(scheduler=SchedulerConfig(max_model_len=max_model_len)))


def test_the_context_is_the_checkpoints_by_default() -> None:
    core = _core()  # 32k positions, a KV cache of 65,536 tokens
    assert SchedulerConfig().max_model_len is None
    assert core.max_model_len == 32768 and core.context_note is None
    core.add_request("r", [1] * 5000, SamplingParams(max_tokens=16))  # beyond the old fixed 4,096


def test_max_model_len_chooses_a_shorter_context() -> None:
    core = _core(8192)
    assert core.max_model_len == 8192 and core.context_note is None
    with pytest.raises(PromptTooLongError) as info:
        core.add_request("r", [1] * 8000, SamplingParams(max_tokens=500))
    assert info.value.max_model_len == 8192 and "KV cache" not in str(info.value)


def test_a_context_beyond_the_checkpoints_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"max_model_len 40000 .*max_position_embeddings 32768"):
        _core(40000)


def test_a_context_the_kv_cache_cannot_hold_is_refused_when_asked_for() -> None:
    with pytest.raises(ValidationError) as info:
        _core(16384, num_blocks=512)  # 8,192 tokens of KV
    message = str(info.value)
    for part in ("8192 tokens", "max_model_len 16384", "--kv-cache-mb", "--max-model-len"):
        assert part in message


def test_a_kv_cache_shorter_than_the_checkpoints_context_caps_it_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.core"):
        core = _core(num_blocks=8)  # 128 tokens of KV, 32k positions
    assert core.max_model_len == 128
    assert core.context_note is not None and "128" in core.context_note and "32768" in core.context_note
    assert any("128" in r.getMessage() and "--kv-cache-mb" in r.getMessage() for r in caplog.records)
    with pytest.raises(PromptTooLongError) as info:
        core.add_request("r", [1] * 200, SamplingParams(max_tokens=1))
    assert "KV cache" in str(info.value) and "model's context is 128" not in str(info.value)


def test_the_api_sides_refusal_names_the_kv_cache_and_crosses_the_wire() -> None:
    note = "the KV cache holds only 128 tokens; the checkpoint's context is 32768"
    with pytest.raises(PromptTooLongError) as info:
        fit_to_context(SamplingParams(max_tokens=4), 200, 128, context_note=note)
    assert note in str(info.value)
    again = wire.error_from_wire(wire.error_to_wire(info.value))
    assert isinstance(again, PromptTooLongError) and str(again) == str(info.value)
    plain = PromptTooLongError(prompt_tokens=200, max_model_len=128)
    assert "KV cache" not in str(plain)  # vLLM's words when the checkpoint sets the context


def test_max_model_len_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="max_model_len"):
        SchedulerConfig(max_model_len=0)


def test_serve_passes_max_model_len_to_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import exporters.app

    seen = []

    def build_stack(options: exporters.app.ServeOptions) -> None:
        seen.append(options)
        raise ValidationError("stop here")

    monkeypatch.setattr(exporters.app, "build_stack", build_stack)
    result = CliRunner().invoke(app, ["serve", "--checkpoint", str(tmp_path), "--port", "0",
                                      "--max-model-len", "2048"])
    assert "stop here" in result.output and seen[0].max_model_len == 2048
    assert exporters.app.engine_config(seen[0]).scheduler.max_model_len == 2048
    assert exporters.app.engine_config(exporters.app.ServeOptions(checkpoint=tmp_path)).scheduler.max_model_len \
        is None


@pytest.mark.integration
def test_the_served_context_and_the_refusal_reach_the_api_process(tiny_checkpoint: Path) -> None:
    from exporters.app import ServeOptions, build_stack

    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, kv_cache_mb=1.0, max_model_len=256,
                                     prometheus=False))
    try:
        assert stack.engine.max_model_len == 256 and stack.engine.context_note is None
    finally:
        stack.engine.shutdown()
    # 1 MiB holds 2,048 tokens of the tiny model; a context it cannot hold is a start-up error
    with pytest.raises(ValidationError, match="--kv-cache-mb"):
        build_stack(ServeOptions(checkpoint=tiny_checkpoint, kv_cache_mb=0.125, max_model_len=512,
                                 prometheus=False))
