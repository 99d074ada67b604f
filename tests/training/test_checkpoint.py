"""Orbax checkpoints: exact round trip (sharded too), keep-N, metadata, and a resumed step equal to an unbroken one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.training.checkpoint import Checkpointer, key_from_json, key_to_json, run_metadata
from sera_jax.model import Qwen3Config, init_params
from sera_jax.parallel import MeshConfig, make_mesh
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training.step import init_train_state, shard_train_state

CFG = Qwen3Config.preset("tiny", num_layers=1)


def _state(seed=0):
    tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0))
    params = init_params(jax.random.key(seed), CFG)
    state = init_train_state(params, tx)
    # make the optimizer state non-trivial
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.1, params)
    updates, opt = tx.update(grads, state.opt_state, params)
    return state.replace(step=jnp.asarray(1, jnp.int32), opt_state=opt), tx


def _assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_exact_with_metadata(tmp_path):
    state, _ = _state()
    ck = Checkpointer(tmp_path / "ck", every=2, keep=2)
    key = jax.random.fold_in(jax.random.key(353), 7)
    meta = {"stage_clock": 3, "data_order": [5, 2, 9], "cursor": 1, "key": key_to_json(key),
            "run": run_metadata({"a": 1}, [__file__])}
    assert not ck.save(3, state, meta)  # not on the interval
    assert ck.save(4, state, meta)
    ck.wait()
    restored, got = ck.restore(jax.tree.map(jnp.zeros_like, state))
    _assert_equal(restored, state)
    assert got["version"] == 4 and got["data_order"] == [5, 2, 9]
    assert (jax.random.key_data(key_from_json(got["key"])) == jax.random.key_data(key)).all()
    assert len(got["run"]["config_hash"]) == 64 and got["run"]["libraries"]["jax"] == jax.__version__
    assert list(got["run"]["data_sha256"].values())[0] != ""
    ck.close()


def test_keep_n_and_latest(tmp_path):
    state, _ = _state()
    ck = Checkpointer(tmp_path, every=1, keep=2)
    for v in (1, 2, 3):
        ck.save(v, state.replace(step=jnp.asarray(v, jnp.int32)), {})
    ck.wait()
    assert ck.latest() == 3 and sorted(ck.manager.all_steps()) == [2, 3]
    restored, meta = ck.restore(state, version=2)
    assert int(restored.step) == 2 and meta["version"] == 2
    ck.close()
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path / "empty").restore(state)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices: run via tools/run_tests.sh")
def test_sharded_restore_lands_in_shardings(tmp_path):
    state, tx = _state()
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = shard_train_state(state.params, tx, CFG, mesh)
    sharded = sharded.replace(opt_state=jax.device_put(state.opt_state, jax.tree.map(lambda x: x.sharding,
                                                                                     sharded.opt_state)))
    ck = Checkpointer(tmp_path, every=1)
    ck.save(1, sharded, {})
    ck.wait()
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), sharded)
    restored, _ = ck.restore(like)
    _assert_equal(restored, sharded)
    q = restored.params["layers"]["attn"]["q_proj"]
    assert q.sharding == sharded.params["layers"]["attn"]["q_proj"].sharding
    assert q.addressable_shards[0].data.size * 4 == q.size
    ck.close()


def test_params_restore_without_optimizer(tmp_path):
    state, _ = _state()
    ck = Checkpointer(tmp_path, every=1)
    ck.save(5, state, {"model_config": {"a": 1}})
    ck.wait()
    params, meta = ck.restore_params(jax.tree.map(jnp.zeros_like, state.params))
    _assert_equal(params, state.params)
    assert meta["model_config"] == {"a": 1} and meta["version"] == 5
    ck.close()
