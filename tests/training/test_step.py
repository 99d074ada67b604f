"""The jitted train step: micro-batch invariance, non-finite skip, sharded = single device, fp32 master weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.model import Qwen3Config, init_params
from sera_jax.model import param_shardings
from sera_jax.parallel import SAMPLE_RULES, MeshConfig, make_mesh
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.datums import Datum
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training.step import (init_train_state, make_train_step, publish, shard_train_state, stack_micro_batches,
                              train_step)

CFG = Qwen3Config.preset("tiny")


def _datums(params, n=6, seed=0):
    """Datums whose behaviour logprobs are the policy's own (perturbed), prompts untrained, completions trained."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(8, 30))
        tokens = rng.integers(0, CFG.vocab_size, length)
        prompt = int(rng.integers(2, length - 2))
        # behaviour logprobs near the (untrained) policy's, so ratios span both sides of 1 and some clip at 5
        behaviour = np.concatenate([[0.0], -np.log(CFG.vocab_size) + rng.normal(0, 0.7, length - 1)])
        mask = [0] * prompt + [1] * (length - prompt)
        out.append(Datum(tokens=tuple(int(t) for t in tokens), mask=tuple(mask),
                         logprobs=tuple(float(x) for x in behaviour), versions=(0,) * length,
                         reward=0.0, advantage=float(rng.normal()), objective="execution", traj_depth=0,
                         traj_start=1))
    return out


@pytest.fixture(scope="module")
def setup():
    params = init_params(jax.random.key(0), CFG)
    tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0))
    return params, tx, _datums(params)


_JITTED = {}


def _step(params, tx, batch, cfg=CFG):
    key = (id(tx), cfg)
    if key not in _JITTED:  # one compilation per (optimizer, config), reused across tests
        _JITTED[key] = jax.jit(lambda s, b: train_step(s, b, model_cfg=cfg, tx=tx))
    return _JITTED[key](init_train_state(params, tx), batch)


@pytest.mark.slow
def test_micro_batch_split_does_not_change_the_step(setup):
    params, tx, datums = setup
    one = pack_datums(datums, token_budget=10_000, row_len=64)
    many = pack_datums(datums, token_budget=32, row_len=32)  # one row per micro-batch
    assert len(one.micro_batches) == 1 and len(many.micro_batches) >= 3
    s1, m1 = _step(params, tx, stack_micro_batches(one.micro_batches))
    s4, m4 = _step(params, tx, stack_micro_batches(many.micro_batches))
    np.testing.assert_allclose(float(m1["loss"]), float(m4["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m4["grad_norm"]), rtol=1e-4)
    assert float(m1["tokens"]) == float(m4["tokens"]) == sum(sum(d.mask[1:]) for d in datums)
    _same_adam_step(s1.params, s4.params)
    assert int(s1.step) == 1 and float(m1["skipped"]) == 0.0
    # the update really moved the weights
    assert float(m1["update_norm"]) > 1e-4


def _same_adam_step(a_params, b_params, lr: float = 1e-3) -> None:
    """Asserts two first Adam steps from the same weights agree. The step is ≈ lr·g/(|g| + eps): an entry whose
    gradient is ≈ 0 turns float-summation noise (a different reduction order) into up to 2·lr, so all entries agree
    within 10% of lr except at most 1 in 2,000, and every entry within 2·lr."""
    diffs = np.concatenate([np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
                            for a, b in zip(jax.tree.leaves(a_params), jax.tree.leaves(b_params))])
    assert np.mean(diffs > 0.1 * lr) <= 5e-4, np.sort(diffs)[-10:]
    assert diffs.max() <= 2 * lr + 1e-7, diffs.max()


@pytest.mark.slow
def test_padding_micro_batches_cost_nothing_and_change_nothing(setup):
    params, tx, datums = setup
    packed = pack_datums(datums, token_budget=10_000, row_len=64)
    s1, m1 = _step(params, tx, stack_micro_batches(packed.micro_batches))
    s8, m8 = _step(params, tx, stack_micro_batches(packed.micro_batches, num=8, row_multiple=8))
    np.testing.assert_allclose(float(m1["loss"]), float(m8["loss"]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)


def test_non_finite_batch_skips_the_update(setup):
    params, tx, datums = setup
    packed = pack_datums(datums, token_budget=10_000, row_len=64)
    batch = stack_micro_batches(packed.micro_batches)
    adv = np.array(batch.advantages)  # host arrays (stack_micro_batches): poison a copy
    adv[0, 0, :] = np.nan
    bad = batch.replace(advantages=adv)
    state0 = init_train_state(params, tx)
    state, metrics = _step(params, tx, bad)
    assert float(metrics["skipped"]) == 1.0 and int(state.step) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(state0.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_step_is_bitwise_reproducible(setup):
    params, tx, datums = setup
    batch = stack_micro_batches(pack_datums(datums, token_budget=128, row_len=64).micro_batches)
    a, ma = _step(params, tx, batch)
    b, mb = _step(params, tx, batch)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert float(ma["loss"]) == float(mb["loss"])


@pytest.mark.slow
def test_small_lr_survives_in_fp32_master_weights():
    """At lr 3e-6 an Adam step (≈ lr per weight) is below bf16 resolution for O(1e-1) weights: fp32 keeps it."""
    params = init_params(jax.random.key(1), CFG)
    tx = make_optimizer(OptimConfig(warmup_steps=0))  # the paper's lr 3e-6
    datums = _datums(params, n=3, seed=2)
    batch = stack_micro_batches(pack_datums(datums, token_budget=10_000, row_len=64).micro_batches)
    cfg_bf16 = CFG.replace(dtype="bfloat16")
    state, _ = _step(params, tx, batch, cfg_bf16)
    w0 = np.asarray(params["layers"]["mlp"]["up_proj"])
    w1 = np.asarray(state.params["layers"]["mlp"]["up_proj"])
    assert state.params["layers"]["mlp"]["up_proj"].dtype == jnp.float32
    assert np.mean(w0 != w1) > 0.5
    # the same step applied to bf16-stored weights would round away for most entries
    w0_bf16 = w0.astype(jnp.bfloat16)
    assert np.mean((w0_bf16 + (w1 - w0).astype(jnp.bfloat16)).astype(np.float32)
                   != w0_bf16.astype(np.float32)) < 0.2


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices: run via tools/run_tests.sh")
def test_sharded_step_equals_single_device(setup):
    params, tx, datums = setup
    packed = pack_datums(datums, token_budget=128, row_len=64)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    batch = stack_micro_batches(packed.micro_batches, row_multiple=4)
    ref_state, ref_m = _step(params, tx, batch)

    state = shard_train_state(params, tx, CFG, mesh)
    mu = state.opt_state[1][0].mu["layers"]["attn"]["q_proj"]
    assert mu.sharding == state.params["layers"]["attn"]["q_proj"].sharding  # moments sharded like params
    assert mu.addressable_shards[0].data.size * 4 == mu.size
    step = make_train_step(CFG, tx, mesh=mesh, state=state)
    batch = jax.device_put(batch, step.batch_sharding)
    new_state, m = step(state, batch)
    np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m["grad_norm"]), float(ref_m["grad_norm"]), rtol=1e-4)
    _same_adam_step(new_state.params, ref_state.params)
    assert new_state.params["embed"]["embedding"].sharding == state.params["embed"]["embedding"].sharding

    # publish: bf16 copy in the sampler's layout, on device
    sampler = publish(new_state.params, shardings=param_shardings(CFG, mesh, SAMPLE_RULES))
    emb = sampler["embed"]["embedding"]
    assert emb.dtype == jnp.bfloat16 and emb.sharding.spec == jax.sharding.PartitionSpec("tensor", None)
    np.testing.assert_allclose(np.asarray(emb, np.float32), np.asarray(new_state.params["embed"]["embedding"]),
                               rtol=1e-2)
