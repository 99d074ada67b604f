"""The packed flash-attention kernel (Pallas, interpret mode on CPU): outputs and gradients equal the model's
reference ``dense_attention``; the tile bounds never drop a visible (query, key) pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.kernels.flash_attention import flash_attention, flash_attention_with_lse
from sera_jax.kernels.flash_bounds import tile_bounds
from sera_jax.model.qwen3 import dense_attention
from tests.kernels.oracles import fast_jit, packed_segments


def _inputs(rng, b, t, kv, group, e, dtype=jnp.float32):
    n = lambda *s: jnp.asarray(rng.normal(size=s), dtype)
    return n(b, t, kv * group, e), n(b, t, kv, e), n(b, t, kv, e), n(b, t, kv * group, e)


def _ref(q, k, v, seg):
    return dense_attention(q, k, v, None, {"segment_ids": seg})[0]


def _out_and_grads(fn, q, k, v, ct):
    """Returns (fn(q, k, v), its vjp with ``ct``) from one jitted call (op-by-op dispatch would dominate runtime)."""
    def run(q, k, v, ct):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(ct)
    return fast_jit(run)(q, k, v, ct)


def _assert_same_out_and_grads(kern, ref, q, k, v, ct, atol_out=2e-5, atol_grad=5e-5):
    out, grads = _out_and_grads(kern, q, k, v, ct)
    ref_out, ref_grads = _out_and_grads(ref, q, k, v, ct)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=atol_out, rtol=atol_out)
    for name, got, want in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol_grad, rtol=atol_grad,
                                   err_msg=f"d{name}")


def _case(group, seed, reappearing=False):
    # T = 40 is not a multiple of the tiles (internal padding); 3 packed segments then padding (id 0). With
    # ``reappearing``, row 0's first id comes back later (segments need not be contiguous; the bounds stay exact).
    rng = np.random.default_rng(seed)
    q, k, v, ct = _inputs(rng, 2, 40, 1 if group == 8 else 2, group, 16)
    seg = packed_segments(rng, 2, 40)
    if reappearing:
        seg = seg.at[0, 30:36].set(1)
    return q, k, v, ct, seg


@pytest.mark.parametrize("group,block_q,block_k,reappearing", [(1, 16, 16, True), (4, 32, 16, False)])
def test_forward_and_gradients_match_reference(group, block_q, block_k, reappearing):
    # Unequal query/key tiles exercise the tile-index arithmetic of all three kernels.
    q, k, v, ct, seg = _case(group, group, reappearing)
    kern = lambda q, k, v: flash_attention(q, k, v, seg, block_q=block_q, block_k=block_k, interpret=True)
    _assert_same_out_and_grads(kern, lambda q, k, v: _ref(q, k, v, seg), q, k, v, ct)


@pytest.mark.parametrize("group", [2, 8])
def test_forward_matches_reference(group):
    # Gradients share one code path for every group > 1 (the dk/dv loop over the group), covered by group 4 above;
    # here the other ratios check the forward's head -> kv-head mapping. Interpret-mode compiles are the test cost.
    q, k, v, _, seg = _case(group, group)
    out = fast_jit(lambda *a: flash_attention(*a, block_q=16, block_k=16, interpret=True))(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(out), np.asarray(fast_jit(_ref)(q, k, v, seg)), atol=2e-5, rtol=2e-5)


def test_bf16_gradients_close_to_fp32_reference():
    rng = np.random.default_rng(5)
    q, k, v, ct = _inputs(rng, 1, 32, 2, 4, 16)
    seg = packed_segments(rng, 1, 32, max_segments=2)
    bf = lambda x: x.astype(jnp.bfloat16)
    kern = lambda q, k, v: flash_attention(q, k, v, seg, block_q=16, block_k=16, interpret=True)
    out, grads = _out_and_grads(kern, bf(q), bf(k), bf(v), bf(ct))
    assert out.dtype == jnp.bfloat16
    ref_out, ref_grads = _out_and_grads(lambda q, k, v: _ref(q, k, v, seg), q, k, v, ct)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref_out), atol=4e-2, rtol=4e-2)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=6e-2, rtol=6e-2)


def test_lse_output_is_the_row_log_sum_exp():
    rng = np.random.default_rng(2)
    q, k, v, _ = _inputs(rng, 1, 16, 1, 2, 16)
    seg = jnp.ones((1, 16), jnp.int32)
    _, lse = fast_jit(lambda *a: flash_attention_with_lse(*a, block_q=16, block_k=16, interpret=True))(q, k, v, seg)
    s = jnp.einsum("bthe,bshe->bhts", q, jnp.repeat(k, 2, axis=2)) * 16 ** -0.5
    s = jnp.where(jnp.tril(jnp.ones((16, 16), bool)), s, -jnp.inf)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(jax.nn.logsumexp(s, -1).transpose(0, 2, 1)), atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_tile_bounds_cover_every_visible_pair(causal):
    rng = np.random.default_rng(0)
    seg = np.array(packed_segments(rng, 3, 64, max_segments=4))
    seg[2, 40:48] = 1  # a reappearing id
    bq, bk = 16, 8
    kv_lo, kv_hi, q_lo, q_hi = (np.asarray(x) for x in tile_bounds(jnp.asarray(seg), bq, bk, causal))
    visits_qk = np.zeros((3, 64 // bq, 64 // bk), bool)
    visits_kq = np.zeros((3, 64 // bk, 64 // bq), bool)
    for b in range(3):
        for i in range(64 // bq):
            visits_qk[b, i, kv_lo[b, i]:kv_hi[b, i]] = True
        for j in range(64 // bk):
            visits_kq[b, j, q_lo[b, j]:q_hi[b, j]] = True
    t = np.arange(64)
    visible = (seg[:, :, None] == seg[:, None, :]) & ((t[:, None] >= t[None, :]) if causal else True)
    b_idx, tq, tk = np.nonzero(visible)
    assert visits_qk[b_idx, tq // bq, tk // bk].all()
    assert visits_kq[b_idx, tk // bk, tq // bq].all()
    # And the bounds do skip work: with causal packing, far fewer than all tile pairs are visited.
    if causal:
        assert visits_qk.mean() < 0.6
