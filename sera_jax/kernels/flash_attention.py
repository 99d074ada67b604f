"""Pallas (Triton) flash attention for packed training rows: causal, segment ids, grouped kv heads; fwd + bwd.

Public API::

    flash_attention(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, *, causal=True, scale=None, block_q=None,
                    block_k=None, interpret=None) -> out_BTHE                       (differentiable: custom_vjp)
    flash_attention_with_lse(...same...) -> (out_BTHE, lse_BTH fp32)                (forward only, no vjp)

Semantics equal ``sera_jax.model.qwen3.dense_attention``: query t sees key s iff ``seg[t] == seg[s]`` and s <= t
(id 0, padding, is an ordinary id: padding attends to padding). Tensors stay in the model's [B, T, heads, E] layout;
the BlockSpecs stride over heads, so no transpose is materialised.

Forward: one program per (row, q head, query tile); it walks only the key tiles that ``flash_bounds`` says can hold an
unmasked score, with an online softmax in fp32, and stores out and the row log-sum-exp. Backward (flash_backward.py):
FlashAttention-2 style, one kernel for dq (per query tile) and one for dk/dv (per key tile, summing the g query heads
of its kv head), both recomputing probabilities from the saved lse, so no [T, T] array ever exists.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from sera_jax.kernels._common import MASKED, compiler_params, on_gpu, round_up
from sera_jax.kernels.flash_bounds import tile_bounds

NT = (((1,), (1,)), ((), ()))  # a @ b.T
NN = (((1,), (0,)), ((), ()))  # a @ b
TN = (((0,), (0,)), ((), ()))  # a.T @ b

PAD_SEGMENT = -1  # id given to the positions added to reach a whole number of tiles: they see only each other


class Tiles(NamedTuple):
    """One pass's tiling: query/key tile lengths (powers of two, ≥ 16 on GPU) and Triton launch parameters."""
    block_q: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


class FlashConfig(NamedTuple):
    scale: float
    causal: bool
    interpret: bool
    fwd: Tiles
    bwd: Tiles


def default_tiles(t: int) -> tuple[Tiles, Tiles]:
    """Returns (forward, backward) tiles for rows of length t.

    Long rows: forward 128 queries x 64 keys on 8 warps, deep enough to hide latency without spilling the fp32
    accumulator; backward 64 x 64 (its kernels hold two fp32 accumulators, dk and dv). Unmeasured on an H200 so
    far: ``tools/gpu_kernels.sh --sweep`` times the alternatives. Short rows: one small square tile.
    """
    if t >= 128:
        return Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 2)
    small = Tiles(16, 16) if t <= 16 else Tiles(64, 64)
    return small, small


def tile_mask(seg_q, seg_k, q0, k0, causal):
    """Returns the [bq, bk] bool mask of a tile whose queries start at q0 and keys at k0."""
    mask = seg_q[:, None] == seg_k[None, :]
    if causal:
        qpos = q0 + lax.broadcasted_iota(jnp.int32, (seg_q.shape[0], seg_k.shape[0]), 0)
        kpos = k0 + lax.broadcasted_iota(jnp.int32, (seg_q.shape[0], seg_k.shape[0]), 1)
        mask = mask & (qpos >= kpos)
    return mask


def _fwd_kernel(kv_lo_ref, kv_hi_ref, q_ref, k_ref, v_ref, segq_ref, segk_ref, o_ref, lse_ref, *,
                scale, block_k, causal):
    b, i = pl.program_id(0), pl.program_id(2)
    q = q_ref[...]  # [bq, E]
    seg_q = segq_ref[...]
    bq, e = q.shape
    q0 = i * bq

    def body(j, carry):
        acc, m, l = carry
        k0 = j * block_k
        k = k_ref[pl.ds(k0, block_k), :]
        v = v_ref[pl.ds(k0, block_k), :]
        mask = tile_mask(seg_q, segk_ref[pl.ds(k0, block_k)], q0, k0, causal)
        s = lax.dot_general(q, k, NT, preferred_element_type=jnp.float32) * scale
        s = jnp.where(mask, s, MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        # Explicit zeros: a row whose tiles so far are all masked has m_new = MASKED and exp(0) = 1 otherwise.
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        pv = lax.dot_general(p.astype(v.dtype), v, NN, preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_new, l * alpha + jnp.sum(p, axis=1)

    init = (jnp.zeros((bq, e), jnp.float32), jnp.full((bq,), MASKED, jnp.float32), jnp.zeros((bq,), jnp.float32))
    acc, m, l = lax.fori_loop(kv_lo_ref[b, i], kv_hi_ref[b, i], body, init)
    l_safe = jnp.where(l > 0, l, 1.0)  # every real query sees itself; this only guards fully masked padding rows
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l_safe)


def _whole(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def _forward(q, k, v, seg, bounds, cfg: FlashConfig):
    """Padded inputs -> (out [B, T, H, E] q.dtype, lse [B, H, T] fp32)."""
    bq, bk, warps, stages = cfg.fwd
    interpret = cfg.interpret
    b, t, h, e = q.shape
    g = h // k.shape[2]
    kv_lo, kv_hi, _, _ = bounds[0]
    kernel = functools.partial(_fwd_kernel, scale=cfg.scale, block_k=bk, causal=cfg.causal)
    return pl.pallas_call(
        kernel,
        grid=(b, h, t // bq),
        in_specs=[_whole(kv_lo.shape), _whole(kv_hi.shape),
                  pl.BlockSpec((None, bq, None, e), lambda r, hh, i: (r, i, hh, 0)),
                  pl.BlockSpec((None, t, None, e), lambda r, hh, i: (r, 0, hh // g, 0)),
                  pl.BlockSpec((None, t, None, e), lambda r, hh, i: (r, 0, hh // g, 0)),
                  pl.BlockSpec((None, bq), lambda r, hh, i: (r, i)),
                  pl.BlockSpec((None, t), lambda r, hh, i: (r, 0))],
        out_specs=[pl.BlockSpec((None, bq, None, e), lambda r, hh, i: (r, i, hh, 0)),
                   pl.BlockSpec((None, None, bq), lambda r, hh, i: (r, hh, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, t), jnp.float32)],
        interpret=interpret,
        compiler_params=compiler_params(interpret, warps, stages),
        name="flash_attention_fwd",
    )(kv_lo, kv_hi, q, k, v, seg, seg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, seg, bounds, cfg):
    return _forward(q, k, v, seg, bounds, cfg)[0]


def _flash_fwd(q, k, v, seg, bounds, cfg):
    out, lse = _forward(q, k, v, seg, bounds, cfg)
    return out, (q, k, v, seg, bounds, out, lse)


def _flash_bwd(cfg, res, d_out):
    from sera_jax.kernels.flash_backward import backward  # one concept per file: the two backward kernels
    q, k, v, seg, bounds, out, lse = res
    dq, dk, dv = backward(q, k, v, seg, bounds, out, lse, d_out, cfg)
    return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _prepare(q, k, v, seg, causal, scale, block_q, block_k, interpret, fwd_tiles, bwd_tiles):
    if interpret is None:
        interpret = not on_gpu()
    b, t, h, e = q.shape
    if h % k.shape[2]:
        raise ValueError(f"query heads {h} must be a multiple of kv heads {k.shape[2]}")
    fwd, bwd = default_tiles(t)
    if block_q or block_k:
        fwd = bwd = Tiles(block_q or block_k, block_k or block_q)
    fwd, bwd = fwd_tiles or fwd, bwd_tiles or bwd
    tp = round_up(t, max(fwd.block_q, fwd.block_k, bwd.block_q, bwd.block_k))  # powers of two: max is the lcm
    pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
    seg = jnp.pad(seg.astype(jnp.int32), ((0, 0), (0, tp - t)), constant_values=PAD_SEGMENT)
    cfg = FlashConfig(float(e ** -0.5 if scale is None else scale), bool(causal), bool(interpret), fwd, bwd)
    bounds = (tile_bounds(seg, fwd.block_q, fwd.block_k, causal), tile_bounds(seg, bwd.block_q, bwd.block_k, causal))
    return pad(q), pad(k), pad(v), seg, bounds, cfg


_STATIC = ("causal", "scale", "block_q", "block_k", "interpret", "fwd_tiles", "bwd_tiles")


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_attention(q_BTHE: Float[Array, "B T H E"], k_BTKE: Float[Array, "B T K E"], v_BTKE: Float[Array, "B T K E"],
                    segment_ids_BT: Int[Array, "B T"], *, causal: bool = True, scale: float | None = None,
                    block_q: int | None = None, block_k: int | None = None, interpret: bool | None = None,
                    fwd_tiles: Tiles | None = None, bwd_tiles: Tiles | None = None) -> Float[Array, "B T H E"]:
    """Returns attention out [B, T, H, E] in q's dtype; differentiable in q, k, v (Pallas backward kernels).

    Tiling: ``default_tiles(T)``; ``block_q``/``block_k`` set both passes' tile lengths; ``fwd_tiles``/``bwd_tiles``
    set a pass completely. T is padded up to a whole number of tiles internally. ``interpret=None`` compiles for
    the GPU when there is one and interprets elsewhere.
    """
    qp, kp, vp, seg, bounds, cfg = _prepare(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, causal, scale, block_q, block_k,
                                            interpret, fwd_tiles, bwd_tiles)
    return _flash(qp, kp, vp, seg, bounds, cfg)[:, :q_BTHE.shape[1]]


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_attention_with_lse(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, *, causal: bool = True,
                             scale: float | None = None, block_q: int | None = None, block_k: int | None = None,
                             interpret: bool | None = None, fwd_tiles: Tiles | None = None,
                             bwd_tiles: Tiles | None = None):
    """Returns (out [B, T, H, E] q.dtype, lse [B, T, H] fp32); forward only (used by inference to merge partials)."""
    qp, kp, vp, seg, bounds, cfg = _prepare(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, causal, scale, block_q, block_k,
                                            interpret, fwd_tiles, bwd_tiles)
    out, lse = _forward(qp, kp, vp, seg, bounds, cfg)
    t = q_BTHE.shape[1]
    return out[:, :t], lse[:, :, :t].transpose(0, 2, 1)
