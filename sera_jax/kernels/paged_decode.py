"""Pallas (Triton) kernel: attention of a few query tokens per row over that row's paged, ragged KV cache.

Signature (the kernel's own; ``paged_attention.py`` adapts it to the engine)::

    paged_decode_attention(q_BTHE, k_pool, v_pool, layer, block_tables_BW, lengths_B, *, scale=None,
                           num_splits=1, interpret=None) -> (out_BTHE fp32, lse_BTH fp32)

``k_pool``/``v_pool`` are the engine's pool layout [layers, blocks, block_size, kv_heads, head_dim] (or
[blocks, block_size, kv_heads, head_dim] with ``layer=None``). Row ``b`` owns the first ``lengths[b]`` cache slots,
reached through ``block_tables[b]`` in order; every query of the row sees all of them (they precede the queries) and
nothing else. Entries of a table past the row's last page are never read, so they may hold anything.

How the work is cut, and why:
  * one program per (row, kv head, tile of query rows, split of the page range). The g = H/K query heads that share a
    kv head, times the T query tokens, are stacked as the rows of one tile, so each cached page is read from HBM once
    per kv head and used by g*T queries: decode is memory-bound, and that read is the cost.
  * the loop walks pages in order with an online softmax (running max, running denominator, fp32 accumulator); the
    page's block id is a scalar read from the table, and the page is a contiguous [block_size, head_dim] slice of the
    pool, so no gathered copy of the cache is ever made.
  * ``num_splits > 1`` cuts the page range into parts handled by separate programs (for few rows with long
    contexts, when rows × kv heads alone would not fill the GPU); the parts merge exactly through their lse.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from sera_jax.kernels._common import MASKED, compiler_params, merge_partials, on_gpu, pow2_at_least, round_up

_NT = (((1,), (1,)), ((), ()))  # contract the last dims: a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _kernel(layer_ref, len_ref, table_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, page, pages_per_split):
    b, kvh, split = pl.program_id(0), pl.program_id(1), pl.program_id(3)
    length = len_ref[b]
    layer = layer_ref[0]
    n_pages = (length + page - 1) // page
    first = split * pages_per_split
    last = jnp.minimum(first + pages_per_split, n_pages)
    q = q_ref[...]  # [R, E]
    rows, e = q.shape

    def body(p, carry):
        acc, m, l = carry
        blk = table_ref[b, p]
        k = k_ref[layer, blk, pl.ds(0, page), kvh, :].astype(q.dtype)  # [S, E]
        v = v_ref[layer, blk, pl.ds(0, page), kvh, :].astype(q.dtype)
        valid = (p * page + lax.broadcasted_iota(jnp.int32, (1, page), 1)) < length  # [1, S]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale  # [R, S]
        s = jnp.where(valid, s, MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        prob = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
        # Unwritten slots of the last page may hold anything; zero them so 0 * garbage cannot make a NaN. (The
        # column mask is built from its own iota rather than by reshaping the row mask: no reshape in the kernel.)
        valid_col = (p * page + lax.broadcasted_iota(jnp.int32, (page, 1), 0)) < length
        v = jnp.where(valid_col, v, jnp.zeros_like(v))
        pv = lax.dot_general(prob.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_new, l * alpha + jnp.sum(prob, axis=1)

    init = (jnp.zeros((rows, e), jnp.float32), jnp.full((rows,), MASKED, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    acc, m, l = lax.fori_loop(first, last, body, init)
    nonempty = l > 0
    o_ref[...] = acc / jnp.where(nonempty, l, 1.0)[:, None]
    lse_ref[...] = jnp.where(nonempty, m + jnp.log(jnp.where(nonempty, l, 1.0)), -jnp.inf)


@functools.partial(jax.jit, static_argnames=("scale", "num_splits", "block_rows", "interpret", "num_warps",
                                             "num_stages"))
def paged_decode_attention(q_BTHE: Float[Array, "B T H E"], k_pool, v_pool, layer: Int[Array, ""] | int | None,
                           block_tables_BW: Int[Array, "B W"], lengths_B: Int[Array, "B"], *,
                           scale: float | None = None, num_splits: int = 1, block_rows: int | None = None,
                           interpret: bool | None = None, num_warps: int = 4, num_stages: int = 2):
    """Returns (out [B, T, H, E] fp32, lse [B, T, H] fp32) of each row's queries over its cached tokens only.

    ``out`` is the softmax-weighted average of the cached values; ``lse`` the log of the softmax denominator, -inf
    (with ``out`` = 0) for a row with no cached tokens. Merge with other keys through ``_common.merge_partials``.
    ``interpret=None`` runs the compiled kernel on GPU and Pallas' interpreter elsewhere.
    """
    if interpret is None:
        interpret = not on_gpu()
    if k_pool.ndim == 4:  # a single layer's pool
        k_pool, v_pool, layer = k_pool[None], v_pool[None], 0
    b, t, h, e = q_BTHE.shape
    _, _, page, kv, _ = k_pool.shape
    g = h // kv
    w = block_tables_BW.shape[1]
    scale = e ** -0.5 if scale is None else scale
    rows = t * g
    tile = block_rows or pow2_at_least(min(rows, 64))
    rows_pad = round_up(rows, tile)
    pages_per_split = -(-w // num_splits)

    # [B, T, K, g, E] -> [B, K, T*g, E]: the queries that share a kv head become one tile's rows (t-major).
    q = q_BTHE.reshape(b, t, kv, g, e).transpose(0, 2, 1, 3, 4).reshape(b, kv, rows, e)
    q = jnp.pad(q, ((0, 0), (0, 0), (0, rows_pad - rows), (0, 0)))
    layer_arr = jnp.asarray(layer, jnp.int32).reshape(1)
    whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))
    kernel = functools.partial(_kernel, scale=scale, page=page, pages_per_split=pages_per_split)
    out, lse = pl.pallas_call(
        kernel,
        grid=(b, kv, rows_pad // tile, num_splits),
        in_specs=[whole((1,)), whole((b,)), whole((b, w)),
                  pl.BlockSpec((None, None, tile, e), lambda i, k, r, s: (i, k, r, 0)),
                  whole(k_pool.shape), whole(v_pool.shape)],
        out_specs=[pl.BlockSpec((None, None, None, tile, e), lambda i, k, r, s: (i, k, s, r, 0)),
                   pl.BlockSpec((None, None, None, tile), lambda i, k, r, s: (i, k, s, r))],
        out_shape=[jax.ShapeDtypeStruct((b, kv, num_splits, rows_pad, e), jnp.float32),
                   jax.ShapeDtypeStruct((b, kv, num_splits, rows_pad), jnp.float32)],
        interpret=interpret,
        compiler_params=compiler_params(interpret, num_warps, num_stages),
        name="paged_decode_attention",
    )(layer_arr, lengths_B.astype(jnp.int32), block_tables_BW.astype(jnp.int32), q, k_pool, v_pool)
    if num_splits > 1:
        out, lse = merge_partials([out[:, :, i] for i in range(num_splits)], [lse[:, :, i] for i in range(num_splits)])
    else:
        out, lse = out[:, :, 0], lse[:, :, 0]
    out = out[:, :, :rows].reshape(b, kv, t, g, e).transpose(0, 2, 1, 3, 4).reshape(b, t, h, e)
    lse = lse[:, :, :rows].reshape(b, kv, t, g).transpose(0, 2, 1, 3).reshape(b, t, h)
    return out, lse
