"""The paged decode kernel (Pallas, interpret mode on CPU) equals a float64 oracle on random paged caches."""

import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.kernels.paged_attention import paged_attention
from sera_jax.kernels.paged_decode import paged_decode_attention
from tests.kernels.oracles import fast_jit, make_paged_case, paged_oracle


def _cache_only(case, **kw):
    fn = fast_jit(lambda *a: paged_decode_attention(*a, interpret=True, **kw))
    return fn(case["q"], case["k_pool"], case["v_pool"], case["layer"], case["table"], case["lengths"])


def _engine_fn(case):
    fn = fast_jit(lambda *a: paged_attention(*a, interpret=True))
    return fn(case["q"], case["k_new"], case["v_new"], case["k_pool"], case["v_pool"], case["layer"], case["table"],
              case["lengths"])


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_cache_part_matches_oracle_across_gqa_ratios(group):
    # Ragged lengths: empty row, one token, partial last page, exact pages, rows sharing their first two blocks.
    rng = np.random.default_rng(group)
    case = make_paged_case(rng, batch=5, kv_heads=2, group=group, head_dim=16, block_size=4,
                           lengths=[0, 1, 7, 8, 13], shared_prefix_blocks=2)
    out, lse = _cache_only(case)
    ref_out, ref_lse = paged_oracle(case, include_new=False)
    assert np.isfinite(np.asarray(out)).all()  # NaN in unowned blocks / unwritten slots never reaches a result
    np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.isneginf(np.asarray(lse)), np.isneginf(ref_lse))  # only the empty row
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(np.asarray(lse)[fin], ref_lse[fin], atol=2e-5, rtol=2e-5)


def test_several_queries_per_row_page_splits_and_the_engine_adapter():
    # Prefill past a cached prefix: T = 3 new tokens per row, 8 query heads per kv head, one empty cache.
    rng = np.random.default_rng(7)
    case = make_paged_case(rng, batch=4, kv_heads=2, group=8, head_dim=16, block_size=4, lengths=[0, 5, 9, 16],
                           shared_prefix_blocks=1, t_new=3)
    ref_out, ref_lse = paged_oracle(case, include_new=False)
    fin = np.isfinite(ref_lse)
    for splits in (1, 3):
        out, lse = _cache_only(case, num_splits=splits)
        np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5, rtol=2e-5)
        np.testing.assert_allclose(np.asarray(lse)[fin], ref_lse[fin], atol=2e-5, rtol=2e-5)
    # The engine-facing function adds the new tokens (causal among themselves, through the flash kernel).
    out = _engine_fn(case)
    ref_out, _ = paged_oracle(case, include_new=True)
    assert out.shape == case["q"].shape and out.dtype == case["q"].dtype
    np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5, rtol=2e-5)


def test_engine_adapter_decode_step():
    # Decode (T = 1): the new token's own key is merged in without a kernel.
    rng = np.random.default_rng(11)
    case = make_paged_case(rng, batch=4, kv_heads=2, group=2, head_dim=16, block_size=4, lengths=[0, 3, 9, 16],
                           shared_prefix_blocks=1, t_new=1)
    out = _engine_fn(case)
    ref_out, _ = paged_oracle(case, include_new=True)
    np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5, rtol=2e-5)


def test_bf16_inputs_stay_close_to_the_oracle():
    rng = np.random.default_rng(3)
    case = make_paged_case(rng, batch=2, kv_heads=2, group=2, head_dim=16, block_size=4, lengths=[6, 10],
                           dtype=jnp.bfloat16)
    out, _ = _cache_only(case)
    ref_out, _ = paged_oracle(case, include_new=False)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref_out, atol=3e-2, rtol=3e-2)
