"""Block manager: allocation is all-or-nothing, frees return every block, usage is exact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import ValidationError
from engine.kv_cache import ROOT_BLOCK_HASH, BlockManager, blocks_for_tokens, extend_block_hashes, hash_block


def test_blocks_for_tokens_rounds_up() -> None:
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_ensure_grows_tables_and_usage() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.ensure(1, 5)  # 2 blocks
    assert bm.ensure(2, 4)  # 1 block
    assert bm.num_blocks_of(1) == 2 and bm.num_blocks_of(2) == 1
    assert bm.usage == pytest.approx(3 / 8)
    assert bm.ensure(1, 8)  # still 2 blocks
    assert bm.num_blocks_of(1) == 2
    assert bm.ensure(1, 9)
    assert bm.num_blocks_of(1) == 3
    assert len(set(bm.block_table(1)) | set(bm.block_table(2))) == 4
    bm.check_invariants()


def test_ensure_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.ensure(1, 12)
    assert not bm.ensure(2, 8)  # needs 2, only 1 free
    assert bm.num_blocks_of(2) == 0
    assert bm.num_free == 1
    bm.check_invariants()


def test_free_returns_every_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.ensure(1, 3)
    bm.ensure(2, 4)
    assert bm.free(1) == 2
    assert bm.free(1) == 0
    assert bm.free(2) == 2
    assert bm.num_free == 4 and bm.usage == 0.0
    assert bm.holders() == []
    bm.check_invariants()


def test_rejects_bad_sizes_listing_all_problems() -> None:
    with pytest.raises(ValidationError) as info:
        BlockManager(num_blocks=0, block_size=0)
    assert len(info.value.problems) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.booleans()), max_size=60))
def test_random_operations_keep_accounting(ops: list[tuple[int, int, bool]]) -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    for seq, tokens, free in ops:
        if free:
            bm.free(seq)
        else:
            before = bm.num_free
            ok = bm.ensure(seq, tokens)
            if not ok:
                assert bm.num_free == before
            else:
                assert bm.num_blocks_of(seq) >= blocks_for_tokens(tokens, 4)
        bm.check_invariants()


# ----------------------------------------------------------------- prefix cache


def _keys(tokens: list[int], block_size: int = 4) -> list[bytes]:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, lambda a, b: tokens[a:b], len(tokens), block_size)
    return hashes


def _compute(bm: BlockManager, seq: int, tokens: list[int]) -> list[bytes]:
    """Give ``seq`` blocks for ``tokens``, as if computed, and key its full blocks."""
    keys = _keys(tokens, bm.block_size)
    assert bm.ensure(seq, len(tokens))
    bm.cache_full_blocks(seq, keys, len(tokens))
    return keys


def test_block_keys_chain_over_the_prefix() -> None:
    a = _keys([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = _keys([1, 2, 3, 4, 5, 6, 7, 8])
    c = _keys([0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and a == b  # the partial third block has no key
    assert a[0] == hash_block(ROOT_BLOCK_HASH, [1, 2, 3, 4]) and a[1] == hash_block(a[0], [5, 6, 7, 8])
    # Same tokens in block 2, different parent: a different key.
    assert c[0] != a[0] and c[1] != a[1]
    assert hash_block(ROOT_BLOCK_HASH, [5, 6, 7, 8]) != a[1]


def test_cached_prefix_finds_leading_blocks_and_shares_them() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    keys = _compute(bm, 1, list(range(1, 11)))  # 2 full blocks keyed, 1 partial
    assert bm.num_cached == 2
    other = _keys([*range(1, 9), 99, 98, 97, 96])
    hit = bm.cached_prefix(other, 3)
    assert hit == list(bm.block_table(1)[:2])
    assert bm.cached_prefix(other, 1) == hit[:1]  # the caller's cap holds
    bm.take_cached(2, hit)
    assert [bm.ref_count(b) for b in hit] == [2, 2]
    assert bm.ensure(2, 12) and bm.num_blocks_of(2) == 3
    assert bm.cached_prefix(keys, 2) == hit
    bm.check_invariants()
    bm.free(1)
    assert [bm.ref_count(b) for b in hit] == [1, 1]
    bm.free(2)
    assert bm.num_free == 8 and bm.num_cached == 2  # free, still cached
    assert bm.cached_prefix(keys, 2) == hit
    bm.check_invariants()


def test_disabled_cache_never_keys_or_finds_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    keys = _compute(bm, 1, list(range(1, 11)))
    assert bm.num_cached == 0 and bm.cached_prefix(keys, 2) == []


def test_uncached_free_blocks_go_first_then_lru_eviction_tail_blocks_first() -> None:
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    first = _compute(bm, 1, [1, 2, 3, 4])  # blocks A0 A1
    second = _compute(bm, 2, [5, 6, 7, 8])  # blocks B0 B1
    a, b = bm.block_table(1), bm.block_table(2)
    bm.free(1)
    bm.free(2)  # LRU order: A1 A0 B1 B0
    assert bm.num_free == 6 and bm.num_cached == 4
    assert bm.ensure(3, 4)  # the 2 unkeyed blocks: nothing evicted
    assert bm.num_cached == 4
    assert bm.ensure(4, 2)  # evicts A1, the least recently freed (a tail block)
    assert bm.block_table(4) == (a[1],)
    assert bm.cached_prefix(first, 2) == [a[0]]
    assert bm.ensure(4, 4)  # then A0
    assert bm.cached_prefix(first, 2) == []
    assert bm.cached_prefix(second, 2) == list(b)
    bm.check_invariants()


def test_a_cache_hit_makes_blocks_young_again() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    first = _compute(bm, 1, [1, 2, 3, 4])
    second = _compute(bm, 2, [5, 6, 7, 8])
    a, b = bm.block_table(1), bm.block_table(2)
    bm.free(1)
    bm.free(2)  # LRU order: A1 A0 B1 B0
    bm.take_cached(3, bm.cached_prefix(first, 2))  # a hit takes A out of the pool...
    bm.free(3)  # ...and puts it back at the young end: B1 B0 A1 A0
    assert bm.ensure(4, 2) and bm.block_table(4) == (b[1],)
    assert bm.cached_prefix(second, 2) == [b[0]] and bm.cached_prefix(first, 2) == list(a)
    bm.check_invariants()


def test_a_block_in_use_is_never_evicted_and_the_budget_never_grows() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    keys = _compute(bm, 1, [1, 2, 3, 4])  # 2 blocks keyed and in use
    assert bm.ensure(2, 4)  # the other 2
    assert not bm.ensure(3, 2)  # no block: refused rather than evicting seq 1's cached blocks
    assert bm.cached_prefix(keys, 2) == list(bm.block_table(1))
    bm.free(2)
    hit = bm.cached_prefix(keys, 2)
    bm.take_cached(3, hit)  # shared now
    bm.free(1)
    assert not bm.ensure(4, 6)  # 2 free, 3 wanted: still all or nothing
    assert bm.ensure(4, 4) and bm.num_free == 0
    assert set(bm.block_table(4)).isdisjoint(hit)
    assert bm.num_blocks == 4 and bm.capacity_tokens == 8
    bm.check_invariants()


def test_equal_blocks_computed_side_by_side_keep_one_key() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    keys = _compute(bm, 1, [1, 2])
    _compute(bm, 2, [1, 2])
    assert bm.num_cached == 1 and bm.cached_prefix(keys, 1) == list(bm.block_table(1))
    bm.free(2)
    bm.free(1)
    assert bm.reset_prefix_cache() == 1 and bm.num_cached == 0
    bm.check_invariants()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 24), st.integers(0, 2), st.booleans()), max_size=50))
def test_random_workloads_keep_the_cache_consistent(ops: list[tuple[int, int, int, bool]]) -> None:
    """Sequences from 3 prompt families come and go: accounting holds, hits are real prefixes, used blocks stay."""
    bm = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=True)
    held: dict[int, list[int]] = {}
    content: dict[int, list[int]] = {}
    """What each block was computed with (the KV it holds)."""
    for seq, length, family, free in ops:
        if free or seq in held:
            bm.free(seq)
            held.pop(seq, None)
            bm.check_invariants()
            continue
        tokens = [family * 100 + i for i in range(length)]
        keys = _keys(tokens)
        hit = bm.cached_prefix(keys, (length - 1) // 4)
        in_use = {b for s in held for b in bm.block_table(s)}
        if blocks_for_tokens(length, 4) - len(hit) > bm.num_free - bm.num_evictable(hit):
            continue
        bm.take_cached(seq, hit)
        assert bm.ensure(seq, length)
        # Blocks other sequences hold were never handed out again, except as shared cache hits.
        assert in_use.isdisjoint(set(bm.block_table(seq)) - set(hit))
        for index, block in enumerate(bm.block_table(seq)):
            if index < len(hit):
                assert content[block] == tokens[index * 4 : (index + 1) * 4]  # a hit holds this very prefix
            else:
                content[block] = tokens[index * 4 : (index + 1) * 4]
        bm.cache_full_blocks(seq, keys, length)
        held[seq] = tokens
        assert bm.num_used <= bm.num_blocks
        bm.check_invariants()
