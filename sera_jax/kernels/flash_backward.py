"""Backward kernels of ``flash_attention`` (FlashAttention-2 style): dq per query tile, dk/dv per key tile.

Both recompute a tile's probabilities from the forward's saved lse, ``p = exp(q·k * scale - lse)``, and use
``delta = rowsum(out * d_out)`` (computed once in plain JAX) for the softmax derivative ``ds = p * (dp - delta)``
with ``dp = d_out · v``. Splitting dq from dk/dv costs one extra recomputation of p but needs no atomics, so the
result does not depend on scheduling order. The dk/dv program of a kv head loops over the g query heads that share
it, which is where grouped-query attention's gradient sum happens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from sera_jax.kernels._common import compiler_params
from sera_jax.kernels.flash_attention import NN, NT, TN, tile_mask


def _dq_kernel(kv_lo_ref, kv_hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, segq_ref, segk_ref, dq_ref,
               *, scale, block_k, causal):
    b, i = pl.program_id(0), pl.program_id(2)
    q, do = q_ref[...], do_ref[...]  # [bq, E]
    lse, delta = lse_ref[...], delta_ref[...]  # [bq]
    seg_q = segq_ref[...]
    q0 = i * q.shape[0]

    def body(j, dq):
        k0 = j * block_k
        k = k_ref[pl.ds(k0, block_k), :]
        v = v_ref[pl.ds(k0, block_k), :]
        mask = tile_mask(seg_q, segk_ref[pl.ds(k0, block_k)], q0, k0, causal)
        s = lax.dot_general(q, k, NT, preferred_element_type=jnp.float32) * scale
        p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
        dp = lax.dot_general(do, v, NT, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + lax.dot_general(ds.astype(k.dtype), k, NN, preferred_element_type=jnp.float32)

    dq = lax.fori_loop(kv_lo_ref[b, i], kv_hi_ref[b, i], body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_lo_ref, q_hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, segq_ref, segk_ref,
                dk_ref, dv_ref, *, scale, block_q, causal, group):
    b, j = pl.program_id(0), pl.program_id(2)
    k, v = k_ref[...], v_ref[...]  # [bk, E]
    seg_k = segk_ref[...]
    k0 = j * k.shape[0]
    lo, hi = q_lo_ref[b, j], q_hi_ref[b, j]

    def per_head(hh, carry):
        def per_tile(i, carry):
            dk, dv = carry
            q0 = i * block_q
            q = q_ref[pl.ds(q0, block_q), hh, :]  # [bq, E]
            do = do_ref[pl.ds(q0, block_q), hh, :]
            lse = lse_ref[hh, pl.ds(q0, block_q)]
            delta = delta_ref[hh, pl.ds(q0, block_q)]
            mask = tile_mask(segq_ref[pl.ds(q0, block_q)], seg_k, q0, k0, causal)  # [bq, bk]
            s = lax.dot_general(q, k, NT, preferred_element_type=jnp.float32) * scale
            p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)  # [bq, bk]
            dv = dv + lax.dot_general(p.astype(do.dtype), do, TN, preferred_element_type=jnp.float32)
            dp = lax.dot_general(do, v, NT, preferred_element_type=jnp.float32)
            ds = p * (dp - delta[:, None])
            dk = dk + lax.dot_general(ds.astype(q.dtype), q, TN, preferred_element_type=jnp.float32)
            return dk, dv

        return lax.fori_loop(lo, hi, per_tile, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, group, per_head, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _whole(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def backward(q, k, v, seg, bounds, out, lse, d_out, cfg):
    """Returns (dq, dk, dv) of the padded forward inputs, in their dtypes. ``lse`` is [B, H, T] fp32."""
    scale, causal, interpret = cfg.scale, cfg.causal, cfg.interpret
    bq, bk, warps, stages = cfg.bwd
    b, t, h, e = q.shape
    kvh = k.shape[2]
    g = h // kvh
    kv_lo, kv_hi, q_lo, q_hi = bounds[1]
    delta = jnp.einsum("bthe,bthe->bht", out.astype(jnp.float32), d_out.astype(jnp.float32))
    d_out = d_out.astype(q.dtype)
    params = compiler_params(interpret, warps, stages)

    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, block_k=bk, causal=causal),
        grid=(b, h, t // bq),
        in_specs=[_whole(kv_lo.shape), _whole(kv_hi.shape),
                  pl.BlockSpec((None, bq, None, e), lambda r, hh, i: (r, i, hh, 0)),
                  pl.BlockSpec((None, t, None, e), lambda r, hh, i: (r, 0, hh // g, 0)),
                  pl.BlockSpec((None, t, None, e), lambda r, hh, i: (r, 0, hh // g, 0)),
                  pl.BlockSpec((None, bq, None, e), lambda r, hh, i: (r, i, hh, 0)),
                  pl.BlockSpec((None, None, bq), lambda r, hh, i: (r, hh, i)),
                  pl.BlockSpec((None, None, bq), lambda r, hh, i: (r, hh, i)),
                  pl.BlockSpec((None, bq), lambda r, hh, i: (r, i)),
                  pl.BlockSpec((None, t), lambda r, hh, i: (r, 0))],
        out_specs=pl.BlockSpec((None, bq, None, e), lambda r, hh, i: (r, i, hh, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret, compiler_params=params, name="flash_attention_dq",
    )(kv_lo, kv_hi, q, k, v, d_out, lse, delta, seg, seg)

    # Blocks of g heads along H: block index ``kk`` covers query heads kk*g .. kk*g+g-1, the group of kv head kk.
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, block_q=bq, causal=causal, group=g),
        grid=(b, kvh, t // bk),
        in_specs=[_whole(q_lo.shape), _whole(q_hi.shape),
                  pl.BlockSpec((None, t, g, e), lambda r, kk, j: (r, 0, kk, 0)),
                  pl.BlockSpec((None, bk, None, e), lambda r, kk, j: (r, j, kk, 0)),
                  pl.BlockSpec((None, bk, None, e), lambda r, kk, j: (r, j, kk, 0)),
                  pl.BlockSpec((None, t, g, e), lambda r, kk, j: (r, 0, kk, 0)),
                  pl.BlockSpec((None, g, t), lambda r, kk, j: (r, kk, 0)),
                  pl.BlockSpec((None, g, t), lambda r, kk, j: (r, kk, 0)),
                  pl.BlockSpec((None, t), lambda r, kk, j: (r, 0)),
                  pl.BlockSpec((None, bk), lambda r, kk, j: (r, j))],
        out_specs=[pl.BlockSpec((None, bk, None, e), lambda r, kk, j: (r, j, kk, 0)),
                   pl.BlockSpec((None, bk, None, e), lambda r, kk, j: (r, j, kk, 0))],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=interpret, compiler_params=params, name="flash_attention_dkv",
    )(q_lo, q_hi, q, k, v, d_out, lse, delta, seg, seg)
    return dq, dk, dv
