"""Implementation selection, and the kernels plugged into their real call sites (model trunk, engine reference)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.kernels import select
from sera_jax.kernels.paged_attention import paged_attention as paged_kernel
from sera_jax.model.qwen3 import dense_attention
from sera_jax.sampling import attention
from tests.kernels.oracles import fast_jit, make_paged_case


def test_reference_on_cpu_kernels_on_request(monkeypatch):
    monkeypatch.delenv(select.ENV, raising=False)
    assert jax.default_backend() == "cpu"
    assert select.resolve_impl() == "reference"
    # training on CPU: blockwise attention (dense for short rows); the reference on request
    assert select.select_training_attention(dense_attention).func is select.blockwise_training_attention
    assert select.select_training_attention(dense_attention, "reference") is dense_attention
    ref = object()
    assert select.select_paged_attention(ref) is ref
    assert select.select_training_attention(dense_attention, "pallas") is select.flash_training_attention
    assert select.select_training_attention(dense_attention, "cudnn") is select.cudnn_training_attention
    assert select.select_paged_attention(ref, "pallas") is select.sharded_paged_attention
    monkeypatch.setenv(select.ENV, "pallas")
    assert select.resolve_impl() == "pallas"
    monkeypatch.setenv(select.ENV, "triton")
    with pytest.raises(ValueError, match="triton"):
        select.resolve_impl()


def test_flash_training_attention_has_the_dense_attention_contract():
    # Same call as the model makes: (q, k, v, layer_cache, aux) -> (out, layer_cache passed through).
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 40, h, 16)), jnp.float32) for h in (4, 2, 2))
    seg = jnp.asarray([[1] * 10 + [2] * 20 + [0] * 10, [1] * 33 + [0] * 7], jnp.int32)
    cache = object()
    passed_through = []

    def call(q, k, v, seg):
        out, new_cache = select.flash_training_attention(q, k, v, cache, {"segment_ids": seg}, block_q=16,
                                                         block_k=16, interpret=True)
        passed_through.append(new_cache is cache)
        return out

    out = fast_jit(call)(q, k, v, seg)
    assert passed_through == [True]
    want, _ = jax.jit(dense_attention)(q, k, v, None, {"segment_ids": seg})
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_paged_kernel_is_a_drop_in_for_the_engine_reference():
    ref = attention.paged_attention
    assert list(inspect.signature(ref).parameters) == list(inspect.signature(paged_kernel).parameters)[:8]
    rng = np.random.default_rng(4)
    case = make_paged_case(rng, batch=4, kv_heads=2, group=8, head_dim=16, block_size=4, lengths=[0, 5, 9, 16],
                           shared_prefix_blocks=1, t_new=3)
    # The reference multiplies zero probabilities by every gathered slot, so its pool must be finite.
    case["k_pool"], case["v_pool"] = jnp.nan_to_num(case["k_pool"]), jnp.nan_to_num(case["v_pool"])
    args = (case["q"], case["k_new"], case["v_new"], case["k_pool"], case["v_pool"], case["layer"],
            case["table"], case["lengths"])
    got = fast_jit(lambda *a: paged_kernel(*a, interpret=True))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fast_jit(ref)(*args)), atol=2e-5, rtol=2e-5)


def test_engine_select_impl_picks_reference_on_cpu_and_kernel_on_request(monkeypatch):
    monkeypatch.delenv(select.ENV, raising=False)
    assert attention.select_impl() is attention.paged_attention
    assert attention.select_impl("pallas") is select.sharded_paged_attention
