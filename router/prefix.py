"""Prefix keys and the consistent-hash ring that prefix affinity walks.

A prompt is cut into blocks (``block_tokens`` token ids, or ``4 x
block_tokens`` characters of text, about as many tokens); each block's hash
covers it and every block before it, as a paged KV cache's block hashes do,
so two prompts share a leading hash exactly when they share those leading
blocks.  Hashes are stable across processes (BLAKE2b), unlike ``hash()``.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from array import array
from collections.abc import Sequence

CHARS_PER_TOKEN = 4
"""Text prompts: characters per token, for length estimates and text blocks."""
VIRTUAL_NODES = 64
"""Points per replica on the ring (evens out the share each replica owns)."""


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def text_blocks(text: str, *, block_tokens: int = 16, max_blocks: int = 8) -> tuple[int, ...]:
    """Chained hashes of the leading full blocks of a text prompt (``4 x block_tokens`` characters each)."""
    width = block_tokens * CHARS_PER_TOKEN
    # surrogatepass: a lone surrogate is valid JSON; the engine answers it with a 400, the hash must not fail first.
    encoded = [text[i : i + width].encode("utf-8", "surrogatepass")
               for i in range(0, min(len(text), width * max_blocks), width)]  # fmt: skip
    return _chain([chunk for chunk in encoded if len(chunk) >= width])


def token_blocks(tokens: Sequence[int], *, block_tokens: int = 16, max_blocks: int = 8) -> tuple[int, ...]:
    """Chained hashes of the leading full blocks of a token-id prompt."""
    full = min(len(tokens) // block_tokens, max_blocks)
    return _chain([_token_bytes(tokens[i * block_tokens : (i + 1) * block_tokens]) for i in range(full)])


def _token_bytes(block: Sequence[int]) -> bytes:
    try:
        return array("q", block).tobytes()
    except OverflowError:  # an id past 64 bits: no model's, and the engine refuses it; hashed as text
        return ",".join(map(str, block)).encode()


def _chain(chunks: Sequence[bytes]) -> tuple[int, ...]:
    hashes: list[int] = []
    previous = b""
    for chunk in chunks:
        value = _digest(previous + chunk)
        hashes.append(value)
        previous = value.to_bytes(8, "big")
    return tuple(hashes)


@functools.lru_cache(maxsize=64)
def ring(names: tuple[str, ...], virtual_nodes: int = VIRTUAL_NODES) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The ring's sorted points and the replica owning each (memoized per replica set)."""
    points = sorted((_digest(f"{name}#{i}".encode()), name) for name in names for i in range(virtual_nodes))
    return tuple(p for p, _ in points), tuple(n for _, n in points)


def walk(key: int, names: tuple[str, ...]) -> list[str]:
    """Replicas in the order the ring meets them clockwise from ``key``, each once."""
    points, owners = ring(tuple(sorted(names)))
    if not points:
        return []
    start = bisect.bisect_left(points, key)
    seen: dict[str, None] = {}
    for offset in range(len(points)):
        seen.setdefault(owners[(start + offset) % len(points)], None)
        if len(seen) == len(names):
            break
    return list(seen)


__all__ = ["CHARS_PER_TOKEN", "VIRTUAL_NODES", "ring", "text_blocks", "token_blocks", "walk"]
