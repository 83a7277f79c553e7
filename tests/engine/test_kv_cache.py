"""Block manager: allocation is all-or-nothing, frees return every block, usage is exact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import ValidationError
from engine.kv_cache import BlockManager, blocks_for_tokens


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
