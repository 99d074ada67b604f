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

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from sera_jax.kernels._common import MASKED, on_gpu, round_up
from sera_jax.kernels.flash_bounds import tile_bounds

NT = (((1,), (1,)), ((), ()))  # a @ b.T
NN = (((1,), (0,)), ((), ()))  # a @ b
TN = (((0,), (0,)), ((), ()))  # a.T @ b

PAD_SEGMENT = -1  # id given to the positions added to reach a whole number of tiles: they see only each other


def tile_mask(seg_q, seg_k, q0, k0, causal):
    """Returns the [bq, bk] bool mask of a tile whose queries start at q0 and keys at k0."""
    mask = seg_q[:, None] == seg_k[None, :]
    if causal:
        qpos = q0 + lax.broadcasted_iota(jnp.int32, (seg_q.shape[0], seg_k.shape[0]), 0)
        kpos = k0 + lax.broadcasted_iota(jnp.int32, (seg_q.shape[0], seg_k.shape[0]), 1)
        mask = mask & (qpos >= kpos)
    return mask


def compiler_params(interpret: bool, num_warps: int, num_stages: int):
    """Returns Triton compiler params on GPU, None in interpret mode."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu  # imported lazily: only the GPU path needs it
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


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


def _forward(q, k, v, seg, bounds, cfg):
    """Padded inputs -> (out [B, T, H, E] q.dtype, lse [B, H, T] fp32)."""
    scale, bq, bk, causal, interpret, warps, stages = cfg
    b, t, h, e = q.shape
    g = h // k.shape[2]
    kv_lo, kv_hi, _, _ = bounds
    kernel = functools.partial(_fwd_kernel, scale=scale, block_k=bk, causal=causal)
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


def _prepare(q, k, v, seg, causal, scale, block_q, block_k, interpret, num_warps, num_stages):
    if interpret is None:
        interpret = not on_gpu()
    b, t, h, e = q.shape
    if h % k.shape[2]:
        raise ValueError(f"query heads {h} must be a multiple of kv heads {k.shape[2]}")
    bq = block_q or (128 if t >= 128 else 16 if t <= 16 else 64)
    bk = block_k or bq
    tp = round_up(t, max(bq, bk))
    pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
    seg = jnp.pad(seg.astype(jnp.int32), ((0, 0), (0, tp - t)), constant_values=PAD_SEGMENT)
    cfg = (float(e ** -0.5 if scale is None else scale), bq, bk, bool(causal), bool(interpret), num_warps,
           num_stages)
    return pad(q), pad(k), pad(v), seg, tile_bounds(seg, bq, bk, causal), cfg


_STATIC = ("causal", "scale", "block_q", "block_k", "interpret", "num_warps", "num_stages")


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_attention(q_BTHE: Float[Array, "B T H E"], k_BTKE: Float[Array, "B T K E"], v_BTKE: Float[Array, "B T K E"],
                    segment_ids_BT: Int[Array, "B T"], *, causal: bool = True, scale: float | None = None,
                    block_q: int | None = None, block_k: int | None = None, interpret: bool | None = None,
                    num_warps: int = 4, num_stages: int = 2) -> Float[Array, "B T H E"]:
    """Returns attention out [B, T, H, E] in q's dtype; differentiable in q, k, v (Pallas backward kernels).

    ``block_q``/``block_k`` are tile lengths (powers of two, ≥ 16 on GPU); T is padded up to a whole number of
    tiles internally. ``interpret=None`` compiles for the GPU when there is one and interprets elsewhere.
    """
    qp, kp, vp, seg, bounds, cfg = _prepare(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, causal, scale, block_q, block_k,
                                            interpret, num_warps, num_stages)
    return _flash(qp, kp, vp, seg, bounds, cfg)[:, :q_BTHE.shape[1]]


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_attention_with_lse(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, *, causal: bool = True,
                             scale: float | None = None, block_q: int | None = None, block_k: int | None = None,
                             interpret: bool | None = None, num_warps: int = 4, num_stages: int = 2):
    """Returns (out [B, T, H, E] q.dtype, lse [B, T, H] fp32); forward only (used by inference to merge partials)."""
    qp, kp, vp, seg, bounds, cfg = _prepare(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, causal, scale, block_q, block_k,
                                            interpret, num_warps, num_stages)
    out, lse = _forward(qp, kp, vp, seg, bounds, cfg)
    t = q_BTHE.shape[1]
    return out[:, :t], lse[:, :, :t].transpose(0, 2, 1)
