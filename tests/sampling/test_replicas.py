"""One engine per device (``EngineReplicas``): pinned task groups stay on one engine and keep its prefix cache, the
pins spread over the engines, tokens equal a single engine's, and new weights reach every replica."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from sera_jax.sampling import SamplingParams
from sera_jax.sampling.replicas import EngineReplicas
from tests.sampling.conftest import ToyTokenizer, engine_config, random_prompts, run


@pytest.fixture(scope="module")
def replicas(cfg, params):
    assert len(jax.devices()) >= 2
    eng = EngineReplicas.build(cfg, params, engine_config(), devices=jax.devices()[:2], tokenizer=ToyTokenizer(),
                               seed=7)
    yield eng
    eng.close()


def test_each_replica_owns_a_device_and_a_pool(replicas):
    devices = [next(iter(e.pool["k"].devices())) for e in replicas.engines]
    assert devices == jax.devices()[:2]
    for e, dev in zip(replicas.engines, devices):
        assert {next(iter(x.devices())) for x in jax.tree.leaves(e.params)} == {dev}


def test_pinned_groups_stay_on_one_engine_and_share_its_prefix_cache(replicas, engine):
    """Four concurrent groups, each 4 branches of one shared prompt issued from child tasks: two groups per engine,
    every request of a group on its engine (only its first branch prefills the prompt), tokens equal to the single
    engine's with the same keys."""
    prompts = random_prompts(3, 4, 40, 40)
    sp = SamplingParams(max_new_tokens=6, temperature=1.0)
    before = [e.stats() for e in replicas.engines]
    seen: dict[int, set[int]] = {}

    async def group(g):
        with replicas.pinned() as mine:
            async def branch(b):  # a child task: inherits the pin
                seen.setdefault(g, set()).add(replicas.engines.index(replicas.pinned_engine()))
                return await replicas.generate(prompts[g], sp, key=jax.random.key(10 * g + b))
            first = await branch(0)  # the shared prompt is cached before the other branches arrive
            rest = await asyncio.gather(*[asyncio.create_task(branch(b)) for b in range(1, 4)])
            return replicas.engines.index(mine), [first, *rest]

    async def main():
        return await asyncio.gather(*[group(g) for g in range(4)])

    out = asyncio.run(main())
    owners = [o for o, _ in out]
    assert sorted(owners) == [0, 0, 1, 1], owners  # pins spread over the engines
    assert all(seen[g] == {owners[g]} for g in range(4))
    for i, e in enumerate(replicas.engines):
        after = e.stats()
        n_groups = owners.count(i)
        assert after["admitted"] - before[i]["admitted"] == 4 * n_groups
        # each group prefilled its 40-token prompt once (block-aligned reuse: at most one partial block again)
        prefilled = after["prefill_tokens"] - before[i]["prefill_tokens"]
        assert prefilled <= n_groups * (40 + 3 * 8), prefilled  # uncached: 4 x 40 a group
    single = run([engine.generate(prompts[g], sp, key=jax.random.key(10 * g + b)) for g in range(4) for b in range(4)])
    got = [r for _, results in out for r in results]
    for a, b in zip(got, single):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)  # batch mix and cached prefixes: fp32 order


def test_unpinned_requests_spread_and_nested_pins_keep_the_outer(replicas):
    prompts = random_prompts(5, 6, 8, 20)
    sp = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = [e.stats()["admitted"] for e in replicas.engines]
    run([replicas.generate(p, sp) for p in prompts])
    spread = [e.stats()["admitted"] - b for e, b in zip(replicas.engines, before)]
    assert spread == [3, 3], spread
    with replicas.pinned() as outer:
        with replicas.pinned() as inner:
            assert inner is outer is replicas.pinned_engine()
    assert replicas.pinned_engine() is None


def test_new_weights_reach_every_replica(cfg, params):
    reps = EngineReplicas.build(cfg, params, engine_config(), devices=jax.devices()[:2], tokenizer=ToyTokenizer())
    try:
        assert reps.version == 0
        zeros = jax.tree.map(lambda x: x * 0.0, params)
        assert reps.load_weights(zeros) == 1
        assert [e.version for e in reps.engines] == [1, 1]
        sp = SamplingParams(max_new_tokens=3, temperature=0.0)

        async def one():
            with reps.pinned():  # two concurrent pins: one on each engine
                return await reps.generate([1, 2, 3], sp)

        results = run([one(), one()])
        assert [e.stats()["admitted"] for e in reps.engines] == [1, 1]
        # all-zero weights: uniform logits, greedy picks token 0 everywhere, tagged with the new version
        for r in results:
            assert r.token_ids == (0, 0, 0) and r.policy_version == 1
            np.testing.assert_allclose(r.logprobs, -np.log(cfg.vocab_size), rtol=1e-5)
    finally:
        reps.close()
    with pytest.raises(ValueError, match="at least one"):
        EngineReplicas([])


def test_fsdp_weights_are_published_once_to_one_engine_per_device(cfg, params):
    """Trainer weights FSDP-sharded over 4 devices, one engine on each: one compiled publish casts and replicates
    them, and every engine takes its own device's copy (no copy of its own); the engines sample with them."""
    from jax.sharding import NamedSharding, PartitionSpec

    from sera_jax.model.sharding import param_shardings
    from sera_jax.parallel.mesh import MeshConfig, make_mesh
    from sera_jax.sampling.publish import publish_fn

    devices = jax.devices()[:4]
    reps = EngineReplicas.build(cfg, params, engine_config(), devices=devices, tokenizer=ToyTokenizer())
    try:
        mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=1), devices)
        sharded = jax.device_put(jax.tree.map(lambda x: x * 0.5, params), param_shardings(cfg, mesh))
        before = publish_fn(reps.engines[0].cfg.dtype, jax.tree.map(
            lambda _: NamedSharding(mesh, PartitionSpec()), sharded))._cache_size()
        assert reps.load_weights(sharded) == 1
        for e, dev in zip(reps.engines, devices):
            for got, want in zip(jax.tree.leaves(e.params), jax.tree.leaves(params)):
                assert got.devices() == {dev} and got.dtype == e.cfg.compute_dtype
                np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32) * 0.5,
                                           rtol=1e-6)
        assert reps.load_weights(sharded) == 2  # the same executable again: traced and compiled once
        assert publish_fn(reps.engines[0].cfg.dtype, jax.tree.map(
            lambda _: NamedSharding(mesh, PartitionSpec()), sharded))._cache_size() == before + 1
        sp = SamplingParams(max_new_tokens=3, temperature=0.0)
        r = run([reps.generate([1, 2, 3], sp)])[0]
        assert r.policy_version == 2 and len(r.token_ids) == 3
    finally:
        reps.close()
