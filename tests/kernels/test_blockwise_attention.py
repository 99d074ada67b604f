"""Blockwise CPU training attention equals the dense reference (fp32, forward and gradients) on packed rows with
padding, grouped-query and plain multi-head layouts, ragged last blocks; and it is what the model trains with on CPU
for long rows (traced under the gradient; the trunk's token logprobs match the dense path)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.kernels import blockwise_attention as blockwise_module
from sera_jax.kernels import select
from sera_jax.kernels.blockwise_attention import blockwise_attention, blockwise_training_attention
from sera_jax.model import Qwen3Config, init_params, token_logprobs
from sera_jax.model.qwen3 import dense_attention


def _packed_segments(rng, b, t):
    """Returns segment ids [b, t]: sequences of random lengths; the first row ends with 8 padding tokens (id 0)."""
    seg = np.zeros((b, t), np.int32)
    for r in range(b):
        pos, sid, end = 0, 1, t - 8 if r == 0 else t
        while pos < end:
            n = min(int(rng.integers(5, t // 2)), end - pos)
            seg[r, pos:pos + n] = sid
            pos, sid = pos + n, sid + 1
    return jnp.asarray(seg)


@pytest.mark.parametrize("t, h, kh, block", [(48, 4, 2, 16), (40, 6, 2, 16), (32, 3, 3, 16), (24, 8, 1, 32)])
def test_equals_dense_forward_and_gradients(t, h, kh, block):
    rng = np.random.default_rng(t + h)
    b, e = 2, 16
    q = jnp.asarray(rng.normal(size=(b, t, h, e)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, t, kh, e)), jnp.float32) for _ in range(2))
    seg = _packed_segments(rng, b, t)
    assert (np.asarray(seg) == 0).any() and len(np.unique(np.asarray(seg))) > 3
    w = jnp.asarray(rng.normal(size=(b, t, h, e)), jnp.float32)

    def dense(q, k, v):
        return dense_attention(q, k, v, None, {"segment_ids": seg})[0]

    def blocks(q, k, v):
        return blockwise_attention(q, k, v, seg, block=block)

    np.testing.assert_allclose(jax.jit(blocks)(q, k, v), jax.jit(dense)(q, k, v), atol=1e-5, rtol=0)
    grads = [jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2)))(q, k, v)
             for f in (blocks, dense)]
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_selected_on_cpu_for_long_rows_and_model_logprobs_match(monkeypatch):
    monkeypatch.delenv(select.ENV, raising=False)
    fn = select.select_training_attention(dense_attention)
    assert fn.func is blockwise_training_attention and fn.keywords["reference"] is dense_attention
    monkeypatch.setenv(select.ENV, "reference")
    assert select.select_training_attention(dense_attention) is dense_attention
    monkeypatch.delenv(select.ENV)

    cfg = Qwen3Config.preset("tiny", vocab_size=256, num_layers=1)
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
    rng = np.random.default_rng(0)
    # Short rows keep the test fast: the thresholds are lowered so that 40 tokens take the blockwise path in
    # blocks of 16 (the last one ragged).
    monkeypatch.setattr(blockwise_module, "MIN_T", 32)
    monkeypatch.setattr(blockwise_module, "block_size", lambda t: 16)
    t = 40
    seg = _packed_segments(rng, 2, t)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, t)), jnp.int32)
    targets = jnp.roll(tokens, -1, axis=1)

    def total(p, impl):
        return jnp.sum(token_logprobs(p, cfg, tokens, targets, seg, attention_impl=impl) * (seg > 0))

    # The model's default (None) on CPU is the blockwise path (seen while tracing its gradient; the backward is
    # the kernel's custom_vjp); "reference" is dense. Gradients equal dense ones by the test above; values here.
    traced = []

    def spy(q, *a, **kw):
        traced.append(q.shape)
        return blockwise_attention(q, *a, **kw)

    monkeypatch.setattr(blockwise_module, "blockwise_attention", spy)
    jax.make_jaxpr(jax.grad(lambda p: total(p, None)))(params)
    assert traced and all(shape[1] == t for shape in traced)
    fwd = jax.jit(total, static_argnums=1)
    np.testing.assert_allclose(fwd(params, None), fwd(params, "reference"), rtol=1e-5)
    # short rows go to the reference
    short = blockwise_module.MIN_T - 1
    q = jnp.ones((1, short, 2, 8))
    out, cache = blockwise_training_attention(q, q, q, "c", {"segment_ids": jnp.ones((1, short), jnp.int32)},
                                              reference=lambda *a: ("dense", a[3]))
    assert (out, cache) == ("dense", "c")


def test_sharded_over_rows_and_heads_equals_unsharded():
    """Rows split over 4 devices and kv heads over 2 (as the training mesh lays them out): same values and
    gradients as on one device."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    rng = np.random.default_rng(5)
    b, t, h, kh, e = 4, 40, 4, 2, 8
    q = jnp.asarray(rng.normal(size=(b, t, h, e)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, t, kh, e)), jnp.float32) for _ in range(2))
    seg = _packed_segments(rng, b, t)

    def loss(q, k, v, seg):
        return jnp.sum(jnp.sin(blockwise_attention(q, k, v, seg, block=16)))

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    want = f(q, k, v, seg)
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("rows", "heads"))
    heads, rows = NamedSharding(mesh, P("rows", None, "heads", None)), NamedSharding(mesh, P("rows", None))
    got = f(*(jax.device_put(x, heads) for x in (q, k, v)), jax.device_put(seg, rows))
    assert len(got[1][0].sharding.device_set) == 8
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), atol=1e-5, rtol=1e-6)
