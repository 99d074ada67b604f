"""Host bookkeeping of the KV pool's blocks: free list, refcounts, the prefix index, LRU eviction.

Blocks are ``block_size`` token slots in the device pool. Block 0 is the trash block and is never handed out.

Prefix index. A *full* block whose keys/values are computed is indexed by a chained digest:
``digest_i = blake2b(digest_{i-1} ‖ tokens of block i)``, so a digest names the whole prefix up to the block's end,
not just the block's own tokens. A new prompt walks its full blocks from the start and reuses every indexed one
(refcount + 1) until the first miss: the longest cached prefix, in whole blocks.

Copy-on-write rule. Indexed blocks are immutable: nobody ever writes into a block another sequence may read.
A sequence writes only into its private blocks, and the block holding a prompt's last token is always private
(its logits must be computed, so that token is re-fed even when the whole prompt is cached). Divergence therefore
happens only at block boundaries: the first block that differs (or only partly matches) is never shared; its
tokens are recomputed into a fresh private block. No device copy is ever needed.

Lifetime. A block's refcount counts the live sequences holding it. At zero, an indexed block stays cached
(LRU-ordered, reusable by the next prompt that matches it) until an allocation needs memory; an unindexed one
returns to the free list. ``clear_index`` forgets all cached content (new weights make old K/V stale).

Pending blocks. A block is indexed when its owner is admitted, before its K/V are computed; it becomes *ready*
when the computation has been dispatched (device calls run in order, so any later call sees it). A request that
would reuse a pending block waits for the next admission round instead of recomputing it.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Sequence

import numpy as np

ROOT_DIGEST = b"sera-jax-prefix-root"


def chain_digests(tokens: Sequence[int], block_size: int, num_blocks: int | None = None) -> list[bytes]:
    """Returns the chained digest of each full block of ``tokens`` (the first ``num_blocks`` if given)."""
    n = len(tokens) // block_size if num_blocks is None else num_blocks
    arr = np.asarray(tokens[: n * block_size], dtype=np.int64)
    out, prev = [], ROOT_DIGEST
    for i in range(n):
        prev = hashlib.blake2b(prev + arr[i * block_size:(i + 1) * block_size].tobytes(), digest_size=16).digest()
        out.append(prev)
    return out


class BlockManager:
    """Allocates pool blocks and keeps the prefix index. Not thread-safe: the engine's driver thread owns it."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"the pool needs at least 2 blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refcount = np.zeros(num_blocks, np.int32)
        self.free: collections.deque[int] = collections.deque(range(1, num_blocks))
        self.index: dict[bytes, int] = {}  # digest -> block
        self.digest_of: dict[int, bytes] = {}  # block -> digest (indexed blocks only)
        self.ready: set[int] = set()  # indexed blocks whose K/V are computed (or dispatched)
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, refcount 0, oldest first
        self.evictions = 0

    # ------------------------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Blocks that can ever be handed out (all but the trash block)."""
        return self.num_blocks - 1

    def num_available(self) -> int:
        """Returns how many blocks an allocation could get now (free + evictable cached)."""
        return len(self.free) + len(self.lru)

    def num_referenced(self) -> int:
        """Returns how many blocks some live sequence holds."""
        return int(np.count_nonzero(self.refcount))

    def num_cached(self) -> int:
        """Returns how many unreferenced blocks are kept for their cached prefix content."""
        return len(self.lru)

    # ------------------------------------------------------------------------------------------------------------
    def match(self, digests: Sequence[bytes]) -> tuple[list[int], bool]:
        """Returns (blocks of the longest indexed prefix of ``digests``, whether it stopped at a pending block)."""
        blocks = []
        for d in digests:
            blk = self.index.get(d)
            if blk is None:
                return blocks, False
            if blk not in self.ready:
                return blocks, True
            blocks.append(blk)
        return blocks, False

    def acquire(self, blocks: Sequence[int]) -> None:
        """Adds one reference to each of ``blocks`` (taking cached ones off the LRU list)."""
        for blk in blocks:
            if self.refcount[blk] == 0:
                self.lru.pop(blk, None)
            self.refcount[blk] += 1

    def allocate(self, n: int) -> list[int] | None:
        """Returns ``n`` fresh private blocks (refcount 1), evicting least-recently-used cached blocks as needed.

        Returns None, changing nothing, if fewer than ``n`` are available.
        """
        if n > self.num_available():
            return None
        out = []
        for _ in range(n):
            if self.free:
                blk = self.free.popleft()
            else:
                blk, _ = self.lru.popitem(last=False)
                self._unindex(blk)
                self.evictions += 1
            self.refcount[blk] = 1
            out.append(blk)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drops one reference from each block; unreferenced ones become cached (if indexed) or free."""
        for blk in blocks:
            if self.refcount[blk] <= 0:
                raise RuntimeError(f"block {blk} released more often than acquired")
            self.refcount[blk] -= 1
            if self.refcount[blk] == 0:
                if blk in self.digest_of:
                    self.lru[blk] = None  # most recently used at the end
                else:
                    self.free.append(blk)

    def register(self, blocks: Sequence[int], digests: Sequence[bytes], ready: bool) -> None:
        """Indexes ``blocks[i]`` under ``digests[i]`` unless that digest (or block) is already indexed."""
        for blk, d in zip(blocks, digests):
            if d in self.index or blk in self.digest_of:
                continue
            self.index[d] = blk
            self.digest_of[blk] = d
            if ready:
                self.ready.add(blk)

    def mark_ready(self, blocks: Sequence[int]) -> None:
        """Marks indexed ``blocks`` as computed (their K/V writes are dispatched)."""
        self.ready.update(b for b in blocks if b in self.digest_of)

    def unindex_pending(self, blocks: Sequence[int]) -> None:
        """Forgets the index entries of ``blocks`` whose K/V were never computed (their owner was cancelled)."""
        for blk in blocks:
            if blk in self.digest_of and blk not in self.ready:
                self._unindex(blk)

    def clear_index(self) -> None:
        """Forgets every cached prefix: cached blocks are freed, held blocks stay with their owners, unindexed."""
        for blk in list(self.lru):
            self.free.append(blk)
        self.lru.clear()
        self.index.clear()
        self.digest_of.clear()
        self.ready.clear()

    def _unindex(self, blk: int) -> None:
        d = self.digest_of.pop(blk, None)
        if d is not None:
            self.index.pop(d, None)
        self.ready.discard(blk)

    def check_invariants(self) -> None:
        """Raises AssertionError if the free list, LRU list and refcounts disagree (used by tests)."""
        free, lru = set(self.free), set(self.lru)
        held = {int(b) for b in np.nonzero(self.refcount)[0]}
        assert 0 not in free | lru | held, "trash block handed out"
        assert not (free & lru) and not (free & held) and not (lru & held), "a block is in two states"
        assert free | lru | held == set(range(1, self.num_blocks)), "a block was lost"
        assert lru <= set(self.digest_of), "a cached block is not indexed"
