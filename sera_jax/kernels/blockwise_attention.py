"""Causal, segment-masked attention in query blocks, in pure JAX: the CPU training path for long rows.

XLA's dense attention on CPU materialises the [T, T] scores, mask and probabilities of every layer (kept as
residuals for the backward pass) and computes the masked upper half too. Here the queries are cut into blocks of
``block`` rows; query block i attends to keys [0, (i+1)·block) only (key blocks above the diagonal are skipped
statically), with an exact softmax over that range, so the work is about half of dense. A ``custom_vjp`` keeps only
q, k, v, the output and the per-row log-sum-exp, and recomputes each block's probabilities in the backward pass:
no [T, T] tensor outlives its block. Grouped-query heads share their key/value block (the G query heads of one kv
head are one matmul).

Exactness: the same function as ``sera_jax.model.qwen3.dense_attention`` (tokens attend to earlier tokens of their
own segment id; padding, id 0, attends to padding), fp32 softmax; ``tests/kernels/test_blockwise_attention.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

NEG = -1e30  # finite: a row always keeps its own (diagonal) key, so the max is finite and exp(NEG - max) = 0


def _blocks(t: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(s + block, t)) for s in range(0, t, block)]


def _layout(q, k, v):
    """Returns q as [B, K, T·G, E] (row t·G + g: query head k·G + g at token t), k and v as [B, K, T, E]: the G query
    heads of a kv head are consecutive rows of one matmul, and every query block is a contiguous row range."""
    b, t, h, e = q.shape
    kh = k.shape[2]
    return (q.reshape(b, t, kh, h // kh, e).transpose(0, 2, 1, 3, 4).reshape(b, kh, t * (h // kh), e),
            k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))


def _scores(qi, kj, seg, q0, q1, g, scale):
    """Returns masked fp32 scores [B, K, (q1-q0)·G, q1] of query rows q0..q1-1 against keys 0..q1-1."""
    s = jnp.einsum("bkre,bkse->bkrs", qi, kj, preferred_element_type=jnp.float32) * scale
    causal = jnp.arange(q0, q1)[:, None] >= jnp.arange(q1)[None, :]
    mask = causal[None] & (seg[:, q0:q1, None] == seg[:, None, :q1])  # [B, bq, S]
    mask = jnp.broadcast_to(mask[:, :, None], (mask.shape[0], q1 - q0, g, q1)).reshape(mask.shape[0], 1, -1, q1)
    return jnp.where(mask, s, NEG)


def _forward(q, k, v, seg, block):
    b, t, h, e = q.shape
    kh = k.shape[2]
    g = h // kh
    qt, kt, vt = _layout(q, k, v)
    scale = e ** -0.5
    outs, lses = [], []
    for q0, q1 in _blocks(t, block):
        s = _scores(qt[:, :, q0 * g:q1 * g], kt[:, :, :q1], seg, q0, q1, g, scale)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        l = jnp.sum(p, axis=-1, keepdims=True)
        outs.append(jnp.einsum("bkrs,bkse->bkre", p, vt[:, :, :q1], preferred_element_type=jnp.float32) / l)
        lses.append((m + jnp.log(l))[..., 0])  # [B, K, bq·G]
    out_t = jnp.concatenate(outs, axis=2)  # [B, K, T·G, E]
    out = out_t.reshape(b, kh, t, g, e).transpose(0, 2, 1, 3, 4).reshape(b, t, h, e)
    return out.astype(q.dtype), jnp.concatenate(lses, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, seg, block):
    return _forward(q, k, v, seg, block)[0]


def _fwd(q, k, v, seg, block):
    out, lse = _forward(q, k, v, seg, block)
    return out, (q, k, v, seg, out, lse)


def _bwd(block, res, d_out):
    q, k, v, seg, out, lse = res
    b, t, h, e = q.shape
    kh = k.shape[2]
    g = h // kh
    scale = e ** -0.5
    qt, kt, vt = _layout(q, k, v)
    dot = _layout(d_out, k, v)[0].astype(jnp.float32)
    delta = jnp.sum(dot * _layout(out, k, v)[0].astype(jnp.float32), axis=-1)  # [B, K, T·G]
    dq_blocks = []
    dk = jnp.zeros(kt.shape, jnp.float32)
    dv = jnp.zeros(vt.shape, jnp.float32)
    for q0, q1 in _blocks(t, block):
        r0, r1 = q0 * g, q1 * g
        qi, doi, kj, vj = qt[:, :, r0:r1], dot[:, :, r0:r1], kt[:, :, :q1], vt[:, :, :q1]
        p = jnp.exp(_scores(qi, kj, seg, q0, q1, g, scale) - lse[..., r0:r1, None])
        dp = jnp.einsum("bkre,bkse->bkrs", doi, vj, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[..., r0:r1, None]) * scale
        dq_blocks.append(jnp.einsum("bkrs,bkse->bkre", ds, kj, preferred_element_type=jnp.float32))
        dk = dk.at[:, :, :q1].add(jnp.einsum("bkrs,bkre->bkse", ds, qi, preferred_element_type=jnp.float32))
        dv = dv.at[:, :, :q1].add(jnp.einsum("bkrs,bkre->bkse", p, doi, preferred_element_type=jnp.float32))
    dq = jnp.concatenate(dq_blocks, axis=2).reshape(b, kh, t, g, e).transpose(0, 2, 1, 3, 4).reshape(q.shape)
    return dq.astype(q.dtype), dk.transpose(0, 2, 1, 3).astype(k.dtype), dv.transpose(0, 2, 1, 3).astype(v.dtype), None


_attention.defvjp(_fwd, _bwd)


def blockwise_attention(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, *, block: int = 128):
    """Returns causal attention within segments, out [B, T, H, E] in q's dtype (differentiable in q, k, v)."""
    return _attention(q_BTHE, k_BTKE, v_BTKE, segment_ids_BT, block)


MIN_T = 128  # shorter rows: dense attention (measured on CPU, bench_train shapes: blockwise ≥ dense from T = 128)


def block_size(t: int) -> int:
    """Returns the query block for rows of ``t`` tokens (single-core CPU timings: 64 up to 256 tokens, 128 above)."""
    return 64 if t <= 256 else 128


def blockwise_training_attention(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux, *, reference):
    """``dense_attention``-compatible: returns (out, layer_cache); ``reference`` (dense) for rows shorter than
    ``MIN_T`` or when keys are not the queries' own tokens."""
    t = q_BTHE.shape[1]
    if t < MIN_T or k_BTKE.shape[1] != t:
        return reference(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux)
    return blockwise_attention(q_BTHE, k_BTKE, v_BTKE, aux["segment_ids"], block=block_size(t)), layer_cache
