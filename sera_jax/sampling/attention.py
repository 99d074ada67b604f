"""Attention over the paged KV cache: one function, a pure-JAX reference that runs on every backend.

Both prefill-past-a-cached-prefix and decode are the same computation: row ``b`` has ``ctx_len[b]`` tokens already
in the pool (reached through its block table) and ``T`` new tokens at positions ``ctx_len[b] + t``. Query ``t``
attends to every cached token and to the new tokens ``0..t`` (causal). Decode is the ``T = 1`` case. Rows are ragged:
each has its own ``ctx_len``; cache slots past it are masked, so whatever an unused block holds is never read.

A GPU Pallas kernel (a later issue) replaces ``paged_attention`` behind this same signature.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def paged_attention(q_BTHE: Float[Array, "B T H E"], k_BTKE: Float[Array, "B T K E"], v_BTKE: Float[Array, "B T K E"],
                    k_pool: Float[Array, "L N S K E"], v_pool: Float[Array, "L N S K E"], layer: Int[Array, ""],
                    block_table_BW: Int[Array, "B W"], ctx_len_B: Int[Array, "B"]) -> Float[Array, "B T H E"]:
    """Returns the attention output [B, T, H, E] (q's dtype) of the new queries over cache ++ new keys.

    ``k_pool``/``v_pool`` are the whole pool [layers, blocks, block_size, kv_heads, head_dim]; ``layer`` picks the
    layer inside the gather itself, so no per-layer copy of the pool is made. ``block_table_BW`` lists each row's
    blocks in order (entries past the row's length may be anything: they are masked). Scores and softmax are fp32.
    """
    b, t, h, e = q_BTHE.shape
    kv = k_BTKE.shape[2]
    g = h // kv
    w, s = block_table_BW.shape[1], k_pool.shape[2]
    scale = e ** -0.5
    # Gather the row's blocks of this layer: [B, W, S, K, E] -> [B, W*S, K, E].
    k_cache = k_pool[layer, block_table_BW].reshape(b, w * s, kv, e)
    v_cache = v_pool[layer, block_table_BW].reshape(b, w * s, kv, e)
    q = q_BTHE.reshape(b, t, kv, g, e)
    dt = q.dtype
    sc_cache = jnp.einsum("btkge,bske->bkgts", q, k_cache.astype(dt), preferred_element_type=jnp.float32) * scale
    sc_new = jnp.einsum("btkge,bske->bkgts", q, k_BTKE.astype(dt), preferred_element_type=jnp.float32) * scale
    cache_ok = jnp.arange(w * s)[None, :] < ctx_len_B[:, None]  # [B, W*S]
    new_ok = jnp.tril(jnp.ones((t, t), dtype=bool))  # [T, T]
    neg = jnp.finfo(jnp.float32).min
    sc_cache = jnp.where(cache_ok[:, None, None, None, :], sc_cache, neg)
    sc_new = jnp.where(new_ok[None, None, None], sc_new, neg)
    probs = jax.nn.softmax(jnp.concatenate([sc_cache, sc_new], axis=-1), axis=-1)
    p_cache, p_new = probs[..., : w * s].astype(dt), probs[..., w * s:].astype(dt)
    out = (jnp.einsum("bkgts,bske->btkge", p_cache, v_cache.astype(dt), preferred_element_type=jnp.float32)
           + jnp.einsum("bkgts,bske->btkge", p_new, v_BTKE.astype(dt), preferred_element_type=jnp.float32))
    return out.reshape(b, t, h, e).astype(q_BTHE.dtype)


def select_impl(impl: str | None = None):
    """Returns the paged attention to call (same signature as ``paged_attention``): the Pallas GPU kernel from
    ``sera_jax.kernels`` on a GPU (run per device under the engine's mesh), this reference elsewhere.
    ``impl`` or $SERA_ATTENTION_IMPL ("reference" | "pallas") overrides the choice."""
    from sera_jax.kernels.select import select_paged_attention  # lazy: the kernels import Pallas
    return select_paged_attention(paged_attention, impl)
