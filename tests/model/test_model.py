"""Model-level properties: exact 4B parameter count, chunked logprobs, packing, scan, clear config errors."""

import math

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.model import (Qwen3Config, abstract_params, default_positions, forward, init_params,
                            param_logical_axes, token_logprobs)
from sera_jax.model.logprobs import chunked_logprobs


def test_4b_preset_parameter_count_is_qwen3_4b():
    cfg = Qwen3Config.preset("qwen3-4b-instruct-2507")
    shapes = abstract_params(cfg)
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) == 4_022_468_096
    assert cfg.num_params() == 4_022_468_096
    # fp32 master weights by default, bf16 compute
    assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
    assert cfg.compute_dtype == jnp.bfloat16
    # layers are stacked (scanned), not unrolled
    assert shapes["layers"]["attn"]["q_proj"].shape == (36, 2560, 32, 128)


def test_every_parameter_has_logical_axes():
    cfg = Qwen3Config.preset("tiny", tie_word_embeddings=False)
    specs = param_logical_axes(cfg)
    shapes = abstract_params(cfg)
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    for spec, leaf in zip(flat_specs, jax.tree.leaves(shapes)):
        assert len(spec) == leaf.ndim and all(isinstance(n, str) for n in spec)
    assert specs["lm_head"] == jax.sharding.PartitionSpec("embed", "vocab")


@pytest.fixture(scope="module")
def tiny():
    cfg = Qwen3Config.preset("tiny", logits_chunk=7)  # a chunk that does not divide the token count
    return cfg, init_params(jax.random.key(1), cfg)


def test_token_logprobs_equal_full_log_softmax(tiny):
    cfg, params = tiny
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 11)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 11)), jnp.int32)
    full = jax.nn.log_softmax(forward(params, cfg, tokens), axis=-1)
    expect = jnp.take_along_axis(full, targets[..., None], axis=-1)[..., 0]
    got = token_logprobs(params, cfg, tokens, targets)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expect), atol=1e-5)
    # gradients agree as well (the chunked path rematerialises logits in the backward pass)
    def loss_full(p):
        lp = jax.nn.log_softmax(forward(p, cfg, tokens), axis=-1)
        return jnp.take_along_axis(lp, targets[..., None], axis=-1).sum()
    g_full = jax.grad(loss_full)(params)
    g_chunk = jax.grad(lambda p: token_logprobs(p, cfg, tokens, targets).sum())(params)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_chunk)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_chunked_logprobs_never_builds_full_logits():
    """The jaxpr of long rows holds no [tokens, vocab] array, only ones of ``chunk`` tokens (over all the rows of a
    step: 4 rows of 32 positions here) by vocab."""
    d, v, t, chunk = 8, 1000, 4096, 128
    hidden = jax.ShapeDtypeStruct((4, t, d), jnp.float32)
    unembed = jax.ShapeDtypeStruct((d, v), jnp.float32)
    targets = jax.ShapeDtypeStruct((4, t), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda h, u, y: chunked_logprobs(h, u, y, chunk).sum(), argnums=(0, 1)))(
        hidden, unembed, targets)
    sizes = set()

    def walk(jp):
        for eqn in jp.eqns:
            for var in eqn.outvars:
                if hasattr(var.aval, "shape") and v in var.aval.shape:
                    sizes.add(math.prod(var.aval.shape))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jaxpr.jaxpr)
    assert sizes and max(sizes) <= chunk * v, sorted(sizes)[-3:]


def _head_inputs(b=3, t=13, d=8, v=50, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    unembed = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    return hidden, unembed, targets


def _full_logprobs(h, u, y):
    return jnp.take_along_axis(jax.nn.log_softmax(h @ u, axis=-1), y[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("chunk", [4, 5, 13, 64])
def test_masked_logprobs_equal_full_ones_at_the_mask(chunk):
    """Masked positions (scattered, a row with none, a row with all) get the full log-softmax value, the others 0,
    and the gradients are those of the masked sum."""
    h, u, y = _head_inputs()
    mask = np.zeros((3, 13), np.int32)
    mask[0, [1, 2, 7, 12]] = 1
    mask[2, :] = 1
    mask = jnp.asarray(mask)
    got = chunked_logprobs(h, u, y, chunk, mask)
    want = jnp.where(mask > 0, _full_logprobs(h, u, y), 0.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    g_got = jax.grad(lambda h, u: jnp.sum(chunked_logprobs(h, u, y, chunk, mask) * 1.7), argnums=(0, 1))(h, u)
    g_want = jax.grad(lambda h, u: jnp.sum(jnp.where(mask > 0, _full_logprobs(h, u, y), 0.0) * 1.7),
                      argnums=(0, 1))(h, u)
    for a, b in zip(g_got, g_want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    with pytest.raises(ValueError, match="mask shape"):
        chunked_logprobs(h, u, y, chunk, mask[:, :5])


def test_masked_logprobs_skip_chunks_without_loss_tokens():
    """Hidden states outside the mask are NaN: they must never reach the head matmul, forward or backward, or the
    unembedding's gradient turns NaN (as it does when the mask is not given). chunk 4 over 2 rows: steps of 2
    positions per row; after the per-row sort row 0 fills steps 0-3, row 1 steps 0-1 (its NaNs share steps 2-3 with
    row 0's loss tokens), steps 4-7 hold no loss token in any row."""
    h, u, y = _head_inputs(b=2, t=16)
    mask = np.zeros((2, 16), np.int32)
    mask[0, [0, 3, 5, 6, 9, 10, 11, 15]] = 1
    mask[1, 4:8] = 1
    mask = jnp.asarray(mask)
    h = jnp.where(mask[..., None] > 0, h, jnp.nan)
    loss = lambda h, u, m: jnp.sum(chunked_logprobs(h, u, y, 4, m))
    value, (g_h, g_u) = jax.value_and_grad(loss, argnums=(0, 1))(h, u, mask)
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(g_u)).all()
    assert np.isfinite(np.asarray(g_h)[np.asarray(mask) > 0]).all()
    assert np.all(np.asarray(g_h)[np.asarray(mask) == 0] == 0)
    assert not np.isfinite(np.asarray(jax.grad(lambda u: loss(h, u, None))(u))).all()  # the test can fail


@pytest.mark.slow
def test_packed_equals_unpacked(tiny):
    cfg, params = tiny
    rng = np.random.default_rng(1)
    lens = [5, 9, 3]
    seqs = [rng.integers(0, cfg.vocab_size, n) for n in lens]
    packed = np.zeros((1, 20), np.int32)
    seg = np.zeros((1, 20), np.int32)
    off = 0
    for i, s in enumerate(seqs):
        packed[0, off:off + len(s)] = s
        seg[0, off:off + len(s)] = i + 1
        off += len(s)
    targets = np.roll(packed, -1, axis=1)
    lp_packed = np.asarray(token_logprobs(params, cfg, jnp.asarray(packed), jnp.asarray(targets),
                                          jnp.asarray(seg)))
    logits_packed = np.asarray(forward(params, cfg, jnp.asarray(packed), segment_ids_BT=jnp.asarray(seg)))
    off = 0
    for s in seqs:
        n = len(s)
        alone = np.asarray(forward(params, cfg, jnp.asarray(s[None], jnp.int32)))[0]
        np.testing.assert_allclose(logits_packed[0, off:off + n], alone, atol=1e-5)
        lp_alone = np.asarray(token_logprobs(params, cfg, jnp.asarray(s[None], jnp.int32),
                                             jnp.asarray(targets[:, off:off + n])))[0]
        np.testing.assert_allclose(lp_packed[0, off:off + n], lp_alone, atol=1e-5)
        off += n
    # without segment ids the same row gives different logits (the test can fail)
    mixed = np.asarray(forward(params, cfg, jnp.asarray(packed)))
    assert np.abs(mixed[0, 5:14] - logits_packed[0, 5:14]).max() > 1e-3


def test_default_positions_restart_per_segment():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0]])
    np.testing.assert_array_equal(np.asarray(default_positions(seg, seg)), [[0, 1, 2, 0, 1, 0, 0, 1]])


def test_remat_and_bf16_compute_run(tiny):
    cfg, params = tiny
    tokens = jnp.ones((1, 6), jnp.int32)
    base = forward(params, cfg, tokens)
    remat = forward(params, cfg.replace(remat=True), tokens)
    np.testing.assert_allclose(np.asarray(base), np.asarray(remat), atol=1e-6)
    g = jax.grad(lambda p: forward(p, cfg.replace(remat=True, dtype="bfloat16"), tokens).sum())(params)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g))  # master-weight gradients stay fp32


@pytest.mark.parametrize("hf, message", [
    ({"model_type": "qwen3_moe"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling"),
    ({"use_sliding_window": True}, "sliding"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_key_value_heads": 3}, "multiple of num_kv_heads"),
])
def test_unsupported_configs_are_refused(hf, message):
    base = Qwen3Config.preset("tiny").to_hf_dict()
    with pytest.raises(ValueError, match=message):
        Qwen3Config.from_hf_dict({**base, **hf})


def test_bad_tokens_and_presets_are_refused(tiny):
    cfg, params = tiny
    with pytest.raises(ValueError, match="batch, length"):
        forward(params, cfg, jnp.ones((4,), jnp.int32))
    with pytest.raises(ValueError, match="unknown Qwen3 preset"):
        Qwen3Config.preset("qwen9")
