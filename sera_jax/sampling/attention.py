"""Attention over the paged KV cache: one function, a pure-JAX reference that runs on every backend.

Both prefill-past-a-cached-prefix and decode are the same computation: row ``b`` has ``ctx_len[b]`` tokens already
in the pool (reached through its block table) and ``T`` new tokens at positions ``ctx_len[b] + t``. Query ``t``
attends to every cached token and to the new tokens ``0..t`` (causal). Decode is the ``T = 1`` case. Rows are ragged:
each has its own ``ctx_len``; cache slots past it are masked, so whatever an unused block holds is never read.

A GPU Pallas kernel (``sera_jax.kernels``) replaces ``paged_attention`` behind this same signature.

Decode on the reference backend takes a cheaper route to the same numbers (``device_loop.decode_chunk``): a chunk's
rows gather their blocks of every layer once, into a dense window per layer (``gather_window``); each step appends
its new key/value to the window (``append_window``) and attends over it (``window_decode_attention``). Gathering
per layer per step instead (``paged_attention`` with T = 1) re-reads and copies the whole context every step; on CPU
that, not the matmuls, dominated decode at batch 32. Appending before attending lets XLA update the window in place
(reading the old window and then writing it would make XLA copy it every step). The window holds keys transposed
([B, K, E, S]) so that the score sum over ``E`` and the value sum over ``S`` both vectorise along contiguous axes.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def paged_attention(q_BTHE: Float[Array, "B T H E"], k_BTKE: Float[Array, "B T K E"], v_BTKE: Float[Array, "B T K E"],
                    k_pool: Float[Array, "L N S K E"], v_pool: Float[Array, "L N S K E"], layer: Int[Array, ""],
                    block_table_BW: Int[Array, "B W"], ctx_len_B: Int[Array, "B"]) -> Float[Array, "B T H E"]:
    """Returns the attention output [B, T, H, E] (q's dtype) of the new queries over cache ++ new keys.

    ``k_pool``/``v_pool`` are the whole pool [layers, blocks, block_size, kv_heads, head_dim]; ``layer`` picks the
    layer inside the gather itself, so no per-layer copy of the pool is made. ``block_table_BW`` lists each row's
    blocks in order (entries past the row's length may be anything: they are masked); it must cover ``ctx_len`` and
    may be narrower than the row's whole table (``W = 0``: no cached context). Scores and softmax are fp32.

    Laid out for the CPU: the query heads sharing a KV head are folded into the query rows ([B, K, T*G, E]), so both
    products are plain batched matmuls over (B, K), and the softmax over the cache and the new tokens is one
    running max and sum, with no concatenated score matrix. XLA's CPU backend ran the former 5-D einsums and
    ``jax.nn.softmax`` 1.5-3.3x slower on the engine's prefill shapes (2 x 512 new tokens: 8.5 -> 2.6 ms a layer).
    """
    b, t, h, e = q_BTHE.shape
    kv = k_BTKE.shape[2]
    g = h // kv
    w, s = block_table_BW.shape[1], k_pool.shape[2]
    dt, f32 = q_BTHE.dtype, jnp.float32
    # Query row r of a KV head is token r // G, head r % G of its group.
    q = (q_BTHE * e ** -0.5).reshape(b, t, kv, g, e).transpose(0, 2, 1, 3, 4).reshape(b, kv, t * g, e)

    def scores(keys_BSKE):
        return jnp.einsum("bkqe,bske->bkqs", q, keys_BSKE.astype(dt), preferred_element_type=f32)

    def values(p_BKQS, vals_BSKE):
        return jnp.einsum("bkqs,bske->bkqe", p_BKQS.astype(dt), vals_BSKE.astype(dt), preferred_element_type=f32)

    new_ok = jnp.arange(t)[None, :] <= (jnp.arange(t * g) // g)[:, None]  # [T*G, T] causal
    sc_new = jnp.where(new_ok, scores(k_BTKE), -jnp.inf)
    m = jnp.max(sc_new, axis=-1, keepdims=True)  # finite: every query sees its own key
    if w:
        # Gather the row's blocks of this layer: [B, W, S, K, E] -> [B, W*S, K, E].
        k_cache = k_pool[layer, block_table_BW].reshape(b, w * s, kv, e)
        v_cache = v_pool[layer, block_table_BW].reshape(b, w * s, kv, e)
        cache_ok = (jnp.arange(w * s)[None, :] < ctx_len_B[:, None])[:, None, None, :]  # [B, 1, 1, W*S]
        sc_cache = jnp.where(cache_ok, scores(k_cache), -jnp.inf)
        m = jnp.maximum(m, jnp.max(sc_cache, axis=-1, keepdims=True))
    p_new = jnp.exp(sc_new - m)
    total = jnp.sum(p_new, axis=-1, keepdims=True)
    out = values(p_new, v_BTKE)
    if w:
        p_cache = jnp.exp(sc_cache - m)
        total = total + jnp.sum(p_cache, axis=-1, keepdims=True)
        out = out + values(p_cache, v_cache)
    out = out / total
    return out.reshape(b, kv, t, g, e).transpose(0, 2, 1, 3, 4).reshape(b, t, h, e).astype(dt)


def gather_window(k_pool: Float[Array, "L N S K E"], v_pool: Float[Array, "L N S K E"], layer: int,
                  block_table_BW: Int[Array, "B W"]):
    """Returns (k [B, K, E, W*S], v [B, K, W*S, E]): layer ``layer``'s blocks of each row, in order, densely.

    Column ``s`` of row ``b`` is the row's token at position ``s`` (whatever the pool holds past the row's length).
    """
    _, _, s, kv, e = k_pool.shape
    b, w = block_table_BW.shape
    k = k_pool[layer, block_table_BW].transpose(0, 3, 4, 1, 2).reshape(b, kv, e, w * s)
    v = v_pool[layer, block_table_BW].transpose(0, 3, 1, 2, 4).reshape(b, kv, w * s, e)
    return k, v


def window_decode_attention(q_B1HE: Float[Array, "B 1 H E"], k_win_BKEW: Float[Array, "B K E W"],
                            v_win_BKWE: Float[Array, "B K W E"], n_B: Int[Array, "B"]) -> Float[Array, "B 1 H E"]:
    """Returns one decode step's attention output [B, 1, H, E] (q's dtype) over the first ``n[b]`` window columns.

    The new token's own key/value must already be in the window (``append_window``), so a row's context is exactly
    its first ``n`` columns: the same result as ``paged_attention`` with T = 1 over the blocks the window was
    gathered from, with ``ctx_len = n - 1`` (fp32 throughout).
    """
    b, _, h, e = q_B1HE.shape
    kv, w = k_win_BKEW.shape[1], k_win_BKEW.shape[-1]
    g = h // kv
    f32 = jnp.float32
    q = q_B1HE.reshape(b, kv, g, e).astype(f32) * e ** -0.5
    # Scores [B, K, G, W]: a sum over E (axis -2 of the transposed keys), vectorised along the window.
    sc = jnp.sum(q[..., None] * k_win_BKEW[:, :, None].astype(f32), axis=-2)
    ok = (jnp.arange(w)[None, :] < n_B[:, None])[:, None, None, :]
    m = jnp.max(jnp.where(ok, sc, -jnp.inf), axis=-1, keepdims=True)
    p = jnp.where(ok, jnp.exp(sc - m), 0.0)
    out = jnp.sum(p[..., None] * v_win_BKWE[:, :, None].astype(f32), axis=-2) / jnp.sum(p, axis=-1)[..., None]
    return out.reshape(b, 1, h, e).astype(q_B1HE.dtype)


def append_window(k_win: Float[Array, "B K E W"], v_win: Float[Array, "B K W E"], new_k_B1KE: Float[Array, "B 1 K E"],
                  new_v_B1KE: Float[Array, "B 1 K E"], pos_B: Int[Array, "B"]):
    """Returns the windows with row ``b``'s new key/value at column ``pos[b]`` (out of range: dropped)."""
    rows = jnp.arange(k_win.shape[0])
    k_win = k_win.at[rows, :, :, pos_B].set(new_k_B1KE[:, 0].astype(k_win.dtype), mode="drop")
    v_win = v_win.at[rows, :, pos_B].set(new_v_B1KE[:, 0].astype(v_win.dtype), mode="drop")
    return k_win, v_win


def select_impl(impl: str | None = None):
    """Returns the paged attention to call (same signature as ``paged_attention``): the Pallas GPU kernel from
    ``sera_jax.kernels`` on a GPU (run per device under the engine's mesh), this reference elsewhere.
    ``impl`` or $SERA_ATTENTION_IMPL ("reference" | "pallas") overrides the choice."""
    from sera_jax.kernels.select import select_paged_attention  # lazy: the kernels import Pallas
    return select_paged_attention(paged_attention, impl)
