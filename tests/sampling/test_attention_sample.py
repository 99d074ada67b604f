"""The paged attention reference equals dense causal attention; the sampler's rules (greedy, top-p, keys)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.model.qwen3 import dense_attention
from sera_jax.sampling.attention import paged_attention
from sera_jax.sampling.sample import sample_tokens


def test_paged_attention_equals_dense_over_scattered_blocks():
    rs = np.random.RandomState(0)
    b, h, kv, e, s, n_blocks, w = 2, 4, 2, 8, 4, 16, 5
    full_len = [13, 9]  # tokens per row: ctx cached + t new
    t = 3
    q_all = rs.randn(b, max(full_len), h, e).astype(np.float32)
    k_all = rs.randn(b, max(full_len), kv, e).astype(np.float32)
    v_all = rs.randn(b, max(full_len), kv, e).astype(np.float32)
    k_pool = rs.randn(1, n_blocks, s, kv, e).astype(np.float32)  # garbage everywhere not written below
    v_pool = rs.randn(1, n_blocks, s, kv, e).astype(np.float32)
    table = np.zeros((b, w), np.int32)
    perm = rs.permutation(np.arange(1, n_blocks))
    ctx = np.array([n - t for n in full_len], np.int32)
    q_new = np.zeros((b, t, h, e), np.float32)
    k_new = np.zeros((b, t, kv, e), np.float32)
    v_new = np.zeros((b, t, kv, e), np.float32)
    for r in range(b):
        table[r] = perm[r * w:(r + 1) * w]
        for p in range(ctx[r]):
            k_pool[0, table[r, p // s], p % s] = k_all[r, p]
            v_pool[0, table[r, p // s], p % s] = v_all[r, p]
        q_new[r] = q_all[r, ctx[r]:ctx[r] + t]
        k_new[r] = k_all[r, ctx[r]:ctx[r] + t]
        v_new[r] = v_all[r, ctx[r]:ctx[r] + t]
    out = paged_attention(q_new, k_new, v_new, k_pool, v_pool, jnp.int32(0), table, ctx)
    for r in range(b):
        n = full_len[r]
        dense, _ = dense_attention(q_all[r:r + 1, :n], k_all[r:r + 1, :n], v_all[r:r + 1, :n], None,
                                   {"segment_ids": np.ones((1, n), np.int32)})
        np.testing.assert_allclose(out[r], dense[0, n - t:n], atol=1e-5)


def test_paged_attention_without_cached_context_is_causal_attention():
    """A first prefill (``W = 0``: no table columns, nothing cached) attends causally over its new tokens only, each
    query head to its own KV group."""
    rs = np.random.RandomState(1)
    b, t, h, kv, e = 2, 7, 4, 2, 8
    q = rs.randn(b, t, h, e).astype(np.float32)
    k = rs.randn(b, t, kv, e).astype(np.float32)
    v = rs.randn(b, t, kv, e).astype(np.float32)
    pool = rs.randn(1, 3, 4, kv, e).astype(np.float32)
    out = paged_attention(q, k, v, pool, pool, jnp.int32(0), np.zeros((b, 0), np.int32), np.zeros(b, np.int32))
    dense, _ = dense_attention(q, k, v, None, {"segment_ids": np.ones((b, t), np.int32)})
    np.testing.assert_allclose(out, dense, atol=1e-5)


def test_sampler_greedy_top_p_and_per_row_keys():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4, jnp.float32))
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), 4))
    temp = jnp.array([0.0, 1.0, 1.0, 1.0])
    top_p = jnp.array([1.0, 1.0, 0.5, 0.79])
    draws = []
    sample = jax.jit(sample_tokens)
    for step in range(200):
        tok, lp = sample(logits, temp, top_p, keys, jnp.full((4,), step, jnp.int32))
        draws.append(np.asarray(tok))
        np.testing.assert_allclose(lp, np.log(np.array([0.5, 0.3, 0.15, 0.05]))[np.asarray(tok)], rtol=1e-6)
    d = np.stack(draws)
    assert (d[:, 0] == 0).all()  # greedy
    assert len(set(d[:, 1])) >= 3  # the full distribution
    assert set(d[:, 2]) == {0}  # nucleus 0.5 keeps only the top token
    assert set(d[:, 3]) == {0, 1}  # 0.5 + 0.3 ≥ 0.79: two tokens
    # A row's draw depends only on its own key and step, not on the other rows.
    tok_a, _ = sample(logits[:2], temp[:2] * 0 + 1, top_p[:2] * 0 + 1, keys[:2], jnp.array([3, 3]))
    tok_b, _ = sample(logits[1:], temp[1:] * 0 + 1, top_p[1:] * 0 + 1, keys[1:], jnp.array([3, 3, 3]))
    assert int(tok_a[1]) == int(tok_b[0])


def test_window_decode_equals_paged_decode():
    """The reference decode route (gather once, append, attend over the window) equals paged_attention with T = 1."""
    from sera_jax.sampling.attention import append_window, gather_window, window_decode_attention

    rs = np.random.RandomState(1)
    layers, b, h, kv, e, s, n_blocks, w = 2, 3, 4, 2, 8, 4, 20, 4
    k_pool = jnp.asarray(rs.randn(layers, n_blocks, s, kv, e).astype(np.float32))
    v_pool = jnp.asarray(rs.randn(layers, n_blocks, s, kv, e).astype(np.float32))
    table = rs.permutation(np.arange(1, n_blocks))[: b * w].reshape(b, w).astype(np.int32)
    ctx = np.array([0, 7, 15], np.int32)  # cached tokens per row (15 = the window's last free column)
    q = rs.randn(b, 1, h, e).astype(np.float32)
    k_new = rs.randn(b, 1, kv, e).astype(np.float32)
    v_new = rs.randn(b, 1, kv, e).astype(np.float32)
    for layer in range(layers):
        want = paged_attention(q, k_new, v_new, k_pool, v_pool, jnp.int32(layer), table, ctx)
        k_win, v_win = gather_window(k_pool, v_pool, layer, table)
        assert k_win.shape == (b, kv, e, w * s) and v_win.shape == (b, kv, w * s, e)
        k_win, v_win = append_window(k_win, v_win, k_new, v_new, ctx)
        got = window_decode_attention(q, k_win, v_win, ctx + 1)
        np.testing.assert_allclose(got, want, atol=1e-5)
        # The append wrote the new token at column ctx[b] and nothing else.
        for r in range(b):
            np.testing.assert_array_equal(k_win[r, :, :, ctx[r]], k_new[r, 0])
            np.testing.assert_array_equal(v_win[r, :, ctx[r]], v_new[r, 0])
    # An out-of-range column (a finished row) is not written.
    k_win, v_win = gather_window(k_pool, v_pool, 0, table)
    k2, v2 = append_window(k_win, v_win, k_new, v_new, np.full(b, w * s, np.int32))
    np.testing.assert_array_equal(k2, k_win)
    np.testing.assert_array_equal(v2, v_win)


def test_prefill_attention_reads_only_the_cached_blocks():
    """A prefill's attention over a table cut to its cached blocks (none at all for a first prefill) equals the
    attention over the row's whole table: what lies past ``ctx_len`` never counts."""
    rs = np.random.RandomState(2)
    layers, b, t, h, kv, e, s, n_blocks, w = 1, 3, 5, 4, 2, 8, 4, 40, 8
    k_pool = jnp.asarray(rs.randn(layers, n_blocks, s, kv, e).astype(np.float32))
    v_pool = jnp.asarray(rs.randn(layers, n_blocks, s, kv, e).astype(np.float32))
    table = rs.permutation(np.arange(1, n_blocks))[: b * w].reshape(b, w).astype(np.int32)
    q = rs.randn(b, t, h, e).astype(np.float32)
    k_new, v_new = rs.randn(2, b, t, kv, e).astype(np.float32)
    for ctx, c in ((np.array([0, 3, 8], np.int32), 2), (np.zeros(3, np.int32), 0)):
        want = paged_attention(q, k_new, v_new, k_pool, v_pool, jnp.int32(0), table, ctx)
        got = paged_attention(q, k_new, v_new, k_pool, v_pool, jnp.int32(0), table[:, :c], ctx)
        np.testing.assert_allclose(got, want, atol=1e-5)
    # And the cut is not a no-op: with cached tokens, dropping their blocks changes the answer.
    ctx = np.array([0, 3, 8], np.int32)
    short = paged_attention(q, k_new, v_new, k_pool, v_pool, jnp.int32(0), table[:, :1], np.minimum(ctx, 4))
    assert np.abs(np.asarray(short) - np.asarray(paged_attention(q, k_new, v_new, k_pool, v_pool, jnp.int32(0),
                                                                     table, ctx))).max() > 1e-3
