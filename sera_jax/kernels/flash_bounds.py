"""Which tiles of a packed, causal attention can hold any unmasked score: per-tile loop bounds for the kernels.

A query at position t sees key s iff ``seg[t] == seg[s]`` (and ``s <= t`` when causal). For every segment id we find
its first and last position in the row; a query tile then needs only the key tiles between the first position of its
queries' segments and (causal) its own end, and a key tile only the query tiles between its start and the last
position of its keys' segments. The bounds are exact for any layout of ids (segments need not be contiguous), and the
kernels still apply the full mask inside every tile they visit, so the bounds only save work, never change results.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int


def _first_last(seg_BT):
    b, t = seg_BT.shape
    # Shift ids into [0, t+1] so a scatter over t+2 slots finds each id's extent; ids outside that range (possible
    # in principle, never produced by rl.batch) make the bounds fall back to "the whole row", which is still exact.
    ids = seg_BT.astype(jnp.int32) + 1
    in_range = jnp.all((ids >= 0) & (ids <= t + 1))
    ids = jnp.clip(ids, 0, t + 1)
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    rows = jnp.arange(b)[:, None]
    first_by_id = jnp.full((b, t + 2), t, jnp.int32).at[rows, ids].min(pos)
    last_by_id = jnp.full((b, t + 2), -1, jnp.int32).at[rows, ids].max(pos)
    first = jnp.take_along_axis(first_by_id, ids, axis=1)
    last = jnp.take_along_axis(last_by_id, ids, axis=1)
    first = jnp.where(in_range, first, 0)
    last = jnp.where(in_range, last, t - 1)
    return first, last


def tile_bounds(seg_BT: Int[Array, "B T"], block_q: int, block_k: int, causal: bool):
    """Returns (kv_lo, kv_hi [B, T/block_q], q_lo, q_hi [B, T/block_k]) int32 tile-index ranges [lo, hi).

    ``kv_lo..kv_hi`` are the key tiles a query tile must visit; ``q_lo..q_hi`` the query tiles a key tile must
    visit. T must be a multiple of both block sizes.
    """
    b, t = seg_BT.shape
    first, last = _first_last(seg_BT)
    nq, nk = t // block_q, t // block_k
    first_q = first.reshape(b, nq, block_q).min(axis=2)
    kv_lo = first_q // block_k
    if causal:
        kv_hi = jnp.broadcast_to(-(-(jnp.arange(1, nq + 1, dtype=jnp.int32) * block_q) // block_k), (b, nq))
        q_lo = jnp.broadcast_to(jnp.arange(nk, dtype=jnp.int32) * block_k // block_q, (b, nk))
    else:
        kv_hi = -(-(last.reshape(b, nq, block_q).max(axis=2) + 1) // block_k)
        q_lo = first.reshape(b, nk, block_k).min(axis=2) // block_q
    q_hi = -(-(last.reshape(b, nk, block_k).max(axis=2) + 1) // block_q)
    return (kv_lo.astype(jnp.int32), kv_hi.astype(jnp.int32), q_lo.astype(jnp.int32), q_hi.astype(jnp.int32))
