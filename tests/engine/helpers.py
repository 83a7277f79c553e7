"""Small helpers shared by engine tests."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.batch import SeqChunk, StepPlan
from engine.executors import Executor


def run_sequences(executor: Executor, prompts: list[list[int]], decode_steps: int, chunk: int = 0) -> torch.Tensor:
    """Prefill every prompt (in chunks of ``chunk`` tokens if > 0), then greedy-decode; stack all logits."""
    blocks_per_seq = executor.num_blocks // max(1, len(prompts))
    tables = [tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(len(prompts))]
    done = [0] * len(prompts)
    logits: list[torch.Tensor] = []
    last_of: dict[int, torch.Tensor] = {}
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        chunks = []
        for i, prompt in enumerate(prompts):
            if done[i] >= len(prompt):
                continue
            size = len(prompt) - done[i] if chunk <= 0 else min(chunk, len(prompt) - done[i])
            end = done[i] + size
            chunks.append(SeqChunk(i, done[i], tuple(prompt[done[i] : end]), tables[i], end == len(prompt)))
            done[i] = end
        out = executor.execute(StepPlan(tuple(chunks)))
        finished = [c.seq_id for c in chunks if c.needs_logits]
        for row, seq in enumerate(finished):
            last_of[seq] = out[row]
    # Prompt-end logits in sequence order, whatever step each prompt ended in.
    logits.append(torch.stack([last_of[i] for i in range(len(prompts))]))
    next_tokens = logits[-1].argmax(dim=-1).tolist()
    for _ in range(decode_steps):
        chunks = [
            SeqChunk(i, done[i], (next_tokens[i],), tables[i], True) for i in range(len(prompts))
        ]
        out = executor.execute(StepPlan(tuple(chunks)))
        logits.append(out)
        for i in range(len(prompts)):
            done[i] += 1
        next_tokens = out.argmax(dim=-1).tolist()
    return torch.cat(logits)


def write_byte_fallback_tokenizer(path: Path) -> Path:
    """A Llama/Mixtral-style ``tokenizer.json`` (byte fallback, ``▁`` for a space, the first space stripped)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for word in ["▁", "a", "▁a", "é", "▁é", "b", "▁b", "你", "▁你"]:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path))
    return path
