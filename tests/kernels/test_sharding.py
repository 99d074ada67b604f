"""Kernels under a device mesh (training and sampling rules): shard_map over local rows and head groups gives the
unsharded result."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax.kernels import select, sharding
from sera_jax.model.qwen3 import dense_attention
from sera_jax.parallel.mesh import MeshConfig, activate, make_mesh
from sera_jax.parallel.rules import SAMPLE_RULES, TRAIN_RULES
from tests.kernels.oracles import fast_jit, make_paged_case, paged_oracle


def _mesh(shape):
    return make_mesh(MeshConfig(*shape), jax.devices()[:int(np.prod(shape))])  # the project's (Auto-axis) mesh


def test_specs_split_divisible_dims_and_keep_head_groups_together():
    q = jax.ShapeDtypeStruct((4, 8, 8, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((4, 8, 2, 16), jnp.float32)
    seg = jax.ShapeDtypeStruct((4, 8), jnp.int32)
    logical = (sharding.Q, sharding.KV, sharding.KV, sharding.ROWS)
    names = sharding._name_axes(_mesh((2, 1, 2)), TRAIN_RULES, logical, (q, kv, kv, seg))
    assert sharding._spec(names, sharding.Q) == P(("data", "fsdp"), None, "tensor", None)
    assert sharding._spec(names, sharding.ROWS) == P(("data", "fsdp"), None)
    # 2 kv heads cannot split 4 ways, so neither may the 8 query heads (a group would straddle devices); and
    # 4 rows cannot split 8 ways, so rows stay whole too.
    names = sharding._name_axes(_mesh((2, 4, 1)), TRAIN_RULES, logical, (q, kv, kv, seg))
    assert sharding._spec(names, sharding.Q) == P(None, None, "tensor", None)
    names = sharding._name_axes(_mesh((1, 2, 4)), TRAIN_RULES, logical, (q, kv, kv, seg))
    assert sharding._spec(names, sharding.Q) == P(("data", "fsdp"), None, None, None)
    assert sharding._spec(names, sharding.KV) == P(("data", "fsdp"), None, None, None)


def test_flash_training_attention_under_a_training_mesh_matches_reference():
    mesh = _mesh((2, 1, 2))
    rng = np.random.default_rng(0)
    q, ct = (jnp.asarray(rng.normal(size=(2, 24, 4, 16)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(2, 24, 2, 16)), jnp.float32) for _ in range(2))
    seg = jnp.asarray([[1] * 9 + [2] * 15, [1] * 20 + [0] * 4], jnp.int32)
    flash = lambda q, k, v: select.flash_training_attention(q, k, v, None, {"segment_ids": seg}, block_q=16,
                                                            block_k=16, interpret=True)[0]
    ref = lambda q, k, v: dense_attention(q, k, v, None, {"segment_ids": seg})[0]

    def out_and_grads(fn):
        def run(q, k, v):
            out, vjp = jax.vjp(fn, q, k, v)
            return out, *vjp(ct)
        with activate(mesh, TRAIN_RULES):  # as the trainer does: mesh and rules active around the jitted call
            return fast_jit(run)(q, k, v)

    got, want = out_and_grads(flash), out_and_grads(ref)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=5e-5)
    # The kernel really ran sharded: its output comes back split over rows and heads.
    assert got[0].sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, "tensor", None)), 4)


def test_paged_attention_under_the_sampling_mesh_matches_the_unsharded_kernel():
    # The engine's layout: rows over data, query heads / kv heads / the pool's kv-head axis over tensor.
    mesh = _mesh((2, 1, 2))
    case = make_paged_case(np.random.default_rng(5), batch=4, kv_heads=2, group=2, head_dim=16, block_size=4,
                           lengths=[0, 3, 9, 16], shared_prefix_blocks=1, t_new=1)
    args = (case["q"], case["k_new"], case["v_new"], case["k_pool"], case["v_pool"], jnp.int32(case["layer"]),
            case["table"], case["lengths"])
    with activate(mesh, SAMPLE_RULES):
        out = fast_jit(lambda *a: select.sharded_paged_attention(*a, interpret=True))(*args)
    np.testing.assert_allclose(np.asarray(out), paged_oracle(case, include_new=True)[0], atol=2e-5, rtol=2e-5)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, "tensor", None)), 4)
