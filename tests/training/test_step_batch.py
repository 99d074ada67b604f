"""The loop's batch builders honour ``batch.advantage_clip`` (one process holding the step, and one process's share
of a multi-host step), and the clip reaches them from the config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from sera_jax.rl.baselines import GroupCredit
from sera_jax.rl.stages import method_config
from sera_jax.training.shared_step import SharedStep, local_figures
from sera_jax.training.step_batch import build_batch, build_shared_batch
from tests.rl.rl_builders import random_datums

SERA = method_config("SERA")
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"


def _groups():
    rng = np.random.default_rng(3)
    ds = [dataclasses.replace(d, advantage=3.0 * d.advantage, traj_depth=k % 3)
          for k, d in enumerate(random_datums(rng, 12, max_len=40))]
    return [GroupCredit(ds[:6], True), GroupCredit(ds[6:], True)]


def _build(groups, clip):
    batch, _ = build_batch(groups, SERA, min_trainable=1, token_budget=128, buckets=(64,), row_multiple=1,
                           advantage_clip=clip)
    return np.asarray(batch.advantages)


def test_changing_advantage_clip_changes_the_built_batch():
    groups = _groups()
    default, wide, narrow, none = (_build(groups, c) for c in (20.0, 1e9, 0.5, None))
    assert np.abs(none).max() > 0.5
    np.testing.assert_array_equal(default, _build(groups, 20.0))
    np.testing.assert_array_equal(wide, none)
    assert np.abs(narrow).max() == 0.5 and not np.array_equal(narrow, none)
    np.testing.assert_array_equal(narrow, np.clip(none, -0.5, 0.5))


def test_changing_advantage_clip_changes_a_shared_steps_batch():
    groups = _groups()
    shared = SharedStep([local_figures(stage="execution", version=3, groups=groups, stats={"trees": 8}, trees=[],
                                       rubric_step_scope=False, times={"time/rollout_s": 1.0}, generation={},
                                       efficiency={}, stop=0)])

    def build(clip):
        batch, _ = build_shared_batch(groups, shared, SERA, min_trainable=1, token_budget=128, buckets=(64,),
                                      row_multiple=1, warmed_micro_batches=(), agree=lambda n: n,
                                      advantage_clip=clip)
        return np.asarray(batch.advantages)

    none, narrow = build(None), build(0.5)
    assert np.abs(none).max() > 0.5 and np.abs(narrow).max() == 0.5
    np.testing.assert_array_equal(narrow, np.clip(none, -0.5, 0.5))
    np.testing.assert_array_equal(build(None), _build(groups, None))  # one process holding it all: the same batch


def test_the_loop_takes_the_configured_clip(tmp_path):
    import asyncio

    from sera_jax.config import load_config
    from sera_jax.training.build import build_loop

    cfg = load_config([CONFIG], ["model.init_from=null", "train.warmup=false", "batch.advantage_clip=0.5"])

    async def clip():
        async with build_loop(cfg, out_dir=tmp_path / "run") as loop:
            return loop.advantage_clip

    assert asyncio.run(clip()) == 0.5
