"""Host block bookkeeping: refcounts, the chained prefix index, the copy-on-write rule, LRU eviction."""

from __future__ import annotations

import pytest

from sera_jax.sampling.block_manager import BlockManager, chain_digests


def test_chained_digests_name_whole_prefixes():
    a = chain_digests([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = chain_digests([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == 2 and len(b) == 2  # only full blocks
    assert a[1] != b[1]  # same block tokens, different prefix: different digest
    assert chain_digests([1, 2, 3, 4, 5, 6, 7, 8], 4) == a


def test_longest_prefix_match_refcounts_and_release_to_lru():
    bm = BlockManager(num_blocks=10, block_size=4)
    toks = list(range(12))
    d = chain_digests(toks, 4)
    blocks = bm.allocate(3)
    assert 0 not in blocks and bm.num_referenced() == 3
    bm.register(blocks, d, ready=True)
    shared, pending = bm.match(chain_digests(toks[:8] + [99, 98, 97, 96], 4))
    assert shared == blocks[:2] and not pending  # diverges in block 3
    bm.acquire(shared)
    assert bm.refcount[blocks[0]] == 2
    bm.release(blocks)
    assert bm.num_cached() == 1 and bm.num_referenced() == 2  # block 3 cached, 1-2 still held by the second user
    bm.release(shared)
    assert bm.num_cached() == 3 and bm.num_available() == 9
    bm.check_invariants()
    with pytest.raises(RuntimeError):
        bm.release([blocks[0]])


def test_pending_blocks_defer_and_cancelled_pending_blocks_are_forgotten():
    bm = BlockManager(num_blocks=6, block_size=2)
    d = chain_digests([1, 2, 3, 4], 2)
    blocks = bm.allocate(2)
    bm.register(blocks, d, ready=False)
    assert bm.match(d) == ([], True)
    bm.mark_ready(blocks[:1])
    assert bm.match(d) == ([blocks[0]], True)
    bm.unindex_pending(blocks)
    bm.release(blocks)
    assert bm.match(d) == ([blocks[0]], False)  # the ready one stays indexed, the never-computed one is gone
    bm.check_invariants()


def test_lru_eviction_prefers_least_recently_released_and_unindexes():
    bm = BlockManager(num_blocks=4, block_size=1)  # 3 usable
    d_old, d_new = chain_digests([7], 1), chain_digests([8], 1)
    old = bm.allocate(1)
    bm.register(old, d_old, ready=True)
    new = bm.allocate(1)
    bm.register(new, d_new, ready=True)
    bm.release(old)
    bm.release(new)
    got = bm.allocate(2)  # 1 free + 1 evicted: the older cached block goes first
    assert old[0] in got and new[0] not in got and bm.evictions == 1
    assert bm.match(d_old) == ([], False) and bm.match(d_new) == (new, False)
    assert bm.allocate(2) is None  # only 1 left: nothing changes
    assert bm.num_available() == 1
    bm.check_invariants()


def test_duplicate_digest_is_not_indexed_twice_and_clear_index_frees_cached():
    bm = BlockManager(num_blocks=5, block_size=2)
    d = chain_digests([1, 2], 2)
    a, b = bm.allocate(1), bm.allocate(1)
    bm.register(a, d, ready=True)
    bm.register(b, d, ready=True)  # a private recomputation of the same content stays private
    bm.release(a + b)
    assert bm.num_cached() == 1 and len(bm.free) == 3
    bm.clear_index()
    assert bm.num_cached() == 0 and bm.match(d) == ([], False) and bm.num_available() == 4
    bm.check_invariants()
