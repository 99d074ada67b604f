"""Sharding over 8 fake CPU devices: real 1/N shards where the rules say so, and unchanged numerics."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sera_jax.model import (Qwen3Config, forward, init_params, load_pretrained, param_logical_axes, param_shardings,
                            shard_params, token_logprobs)
from sera_jax.parallel import SAMPLE_RULES, TRAIN_RULES, MeshConfig, activate, make_mesh, mesh_spec
from tests.model.hf_models import hf_logits, make_hf_qwen3

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices: run via tools/run_tests.sh")


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))


@pytest.fixture(scope="module")
def tiny():
    cfg = Qwen3Config.preset("tiny", tie_word_embeddings=False)
    return cfg, init_params(jax.random.key(0), cfg)


def _is_spec(x):
    return isinstance(x, P)


def test_mesh_shape(mesh):
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert len(set(d.id for d in mesh.devices.flat)) == 8


@pytest.mark.parametrize("rules", [TRAIN_RULES, SAMPLE_RULES], ids=["train", "sample"])
def test_every_parameter_is_sharded_as_the_rules_name(mesh, tiny, rules):
    cfg, params = tiny
    sharded = shard_params(params, cfg, mesh, rules)
    logical = param_logical_axes(cfg)
    flat_logical = jax.tree.leaves(logical, is_leaf=_is_spec)
    n_really_sharded = 0
    for spec, arr, orig in zip(flat_logical, jax.tree.leaves(sharded), jax.tree.leaves(params)):
        want = mesh_spec(spec, rules)
        assert isinstance(arr.sharding, NamedSharding) and arr.sharding.spec == want
        divisor = [1] * arr.ndim
        for dim, axes in enumerate(want):
            for a in (axes,) if isinstance(axes, str) else (axes or ()):
                divisor[dim] *= mesh.shape[a]
        shard_shape = tuple(s // k for s, k in zip(arr.shape, divisor))
        for shard in arr.addressable_shards:
            assert shard.data.shape == shard_shape  # shards really are 1/N of the array
        if math.prod(divisor) > 1:
            n_really_sharded += 1
        np.testing.assert_array_equal(np.asarray(arr), np.asarray(orig))
    # Training: every matrix is sharded, e.g. q_proj over fsdp (embed) × tensor (heads) = 1/4 per device.
    q = sharded["layers"]["attn"]["q_proj"]
    if rules is TRAIN_RULES:
        assert q.sharding.spec == P(None, "fsdp", "tensor", None)
        assert q.addressable_shards[0].data.size * 4 == q.size
        assert n_really_sharded >= 9
    else:
        assert q.sharding.spec == P(None, None, "tensor", None)
        assert q.addressable_shards[0].data.size * 2 == q.size


@pytest.mark.slow
def test_sharded_forward_and_grad_equal_unsharded(mesh, tiny):
    cfg, params = tiny
    tokens = jax.random.randint(jax.random.key(3), (4, 12), 0, cfg.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    ref_logits = forward(params, cfg, tokens)
    ref_loss, ref_grad = jax.value_and_grad(lambda p: token_logprobs(p, cfg, tokens, targets).mean())(params)

    with activate(mesh, TRAIN_RULES):
        p_shard = param_shardings(cfg, mesh, TRAIN_RULES)
        sharded = jax.device_put(params, p_shard)
        data_sharding = NamedSharding(mesh, mesh_spec(("batch", "length"), TRAIN_RULES))
        tok = jax.device_put(tokens, data_sharding)
        tgt = jax.device_put(targets, data_sharding)
        logits = jax.jit(lambda p, t: forward(p, cfg, t))(sharded, tok)
        loss, grad = jax.jit(jax.value_and_grad(lambda p, t, y: token_logprobs(p, cfg, t, y).mean()),
                             out_shardings=(None, p_shard))(sharded, tok, tgt)
    assert tok.addressable_shards[0].data.shape == (1, 12)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=2e-5)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4)
    assert grad["layers"]["mlp"]["up_proj"].sharding.spec == P(None, "fsdp", "tensor")


def test_load_pretrained_places_shards_directly(tmp_path, mesh):
    model = make_hf_qwen3(tmp_path, vocab=300, hidden=40, intermediate=96, heads=4, kv_heads=2, head_dim=10,
                          tied=False)
    cfg, params = load_pretrained(tmp_path, mesh=mesh)
    emb = params["embed"]["embedding"]
    assert emb.sharding.spec == P("tensor", "fsdp")
    assert emb.addressable_shards[0].data.shape == (150, 20)
    o = params["layers"]["attn"]["o_proj"]
    assert o.sharding.spec == P(None, "tensor", None, "fsdp")
    tokens = np.random.default_rng(0).integers(0, 300, (2, 9)).astype(np.int32)
    with activate(mesh, TRAIN_RULES):
        ours = np.asarray(jax.jit(lambda p, t: forward(p, cfg, t))(params, jnp.asarray(tokens)))
    np.testing.assert_array_less(np.abs(ours - hf_logits(model, tokens)).max(), 1e-4)


def test_mesh_that_does_not_divide_is_named(tmp_path):
    cfg = Qwen3Config.preset("tiny", hidden_size=36, intermediate_size=90)
    mesh = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    with pytest.raises(ValueError) as err:
        param_shardings(cfg, mesh, TRAIN_RULES)
    msg = str(err.value)
    assert "['embed']['embedding'] dim 1 (logical 'embed', size 36) is not divisible by mesh axes fsdp of total " \
           "size 8" in msg
    assert "down_proj" in msg


@pytest.mark.parametrize("mc, message", [
    (MeshConfig(data=3, fsdp=-1), "cannot be split"),
    (MeshConfig(data=2, fsdp=2, tensor=1), "has 4 devices, but 8"),
    (MeshConfig(data=-1, fsdp=-1), "at most one"),
    (MeshConfig(data=2, fsdp=4, dcn_data=4), "multiple of dcn_data"),
])
def test_bad_mesh_configs(mc, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(mc)


def test_mesh_config_from_yaml():
    import pathlib

    import yaml
    d = yaml.safe_load(pathlib.Path("configs/mesh_16xh200.yaml").read_text())["mesh"]
    mc = MeshConfig.from_dict(d)
    assert mc.resolve(16) == (2, 8, 1) and mc.dcn_data == 2
    with pytest.raises(ValueError, match="unknown mesh keys"):
        MeshConfig.from_dict({"pipeline": 2})


def _collective_shapes(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """Returns (op, result shape) of every cross-device collective in compiled HLO text (tuple results: each part)."""
    out = []
    for m in re.finditer(r"= (\(.*?\)|\S+) (all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)"
                         r"(?:-start)?\(", hlo):
        for dims in re.findall(r"[a-z]+[0-9]*\[([0-9,]*)\]", m.group(1)):
            out.append((m.group(2), tuple(int(x) for x in dims.split(",") if x)))
    return out


@pytest.mark.slow
def test_output_head_keeps_rows_split_and_moves_no_logits():
    """FSDP over 8 devices (one host of the paper's mesh): the loss head computes each device's own rows against the
    unembedding gathered once. No collective may carry logits (anything vocab-sized but the [D, V] unembedding, its
    FSDP shard [D/8, V] and their gradients — the shard's is reduce-scattered): a head loop over the row axis makes
    XLA split the hidden size instead and all-reduce every chunk's [chunk, V] partial logits, forward and in the
    rematerialised backward. Values equal one device's."""
    cfg = Qwen3Config.preset("tiny")  # V 512, D 64, chunk 64: no other dimension below is 512
    params = init_params(jax.random.key(0), cfg)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (8, 48)), jnp.int32)
    targets = jnp.roll(tokens, -1, axis=1)
    mask = jnp.asarray(rng.random((8, 48)) < 0.4, jnp.int32)
    loss = lambda p, t, y, m: token_logprobs(p, cfg, t, y, mask_BT=m).sum() / m.sum()
    ref_loss, ref_grad = jax.value_and_grad(loss)(params, tokens, targets, mask)

    fsdp = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    with activate(fsdp, TRAIN_RULES):
        p_shard = param_shardings(cfg, fsdp, TRAIN_RULES)
        rows = NamedSharding(fsdp, mesh_spec(("batch", "length"), TRAIN_RULES))
        args = (jax.device_put(params, p_shard),) + tuple(jax.device_put(x, rows) for x in (tokens, targets, mask))
        step = jax.jit(jax.value_and_grad(loss), out_shardings=(None, p_shard))
        hlo = step.lower(*args).compile().as_text()
        got_loss, got_grad = step(*args)

    shapes = _collective_shapes(hlo)
    assert any(op == "all-gather" for op, _ in shapes), "the FSDP step gathers no weights: is it sharded at all?"
    v, d = cfg.vocab_size, cfg.hidden_size
    params_like = (sorted((v, d)), sorted((v, d // 8)))
    logits_like = [(op, s) for op, s in shapes if v in s and sorted(s) not in params_like]
    assert not logits_like, f"collectives carrying logits: {logits_like}"
    np.testing.assert_allclose(float(got_loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(ref_grad)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4)
