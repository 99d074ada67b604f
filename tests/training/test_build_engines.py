"""The run's sampling layout: one engine per configured device with task groups pinned to them, weights published to
every one, and a ``policy_frozen`` judge served by its own engine that training never updates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import jax
import numpy as np
import pytest

from sera_jax.assembly.engines import num_engines
from sera_jax.config import ConfigError, load_config
from sera_jax.training.build import build_loop

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 (fake) devices: run via tools/run_tests.sh")


def test_a_step_runs_its_groups_on_two_engines_and_publishes_to_both(tmp_path):
    cfg = load_config([CONFIG], ["model.init_from=null", "train.warmup=false", "rollout.engines=2", "rollout.tasks_per_step=2",
                                 "rollout.max_completion_tokens=32"])

    async def main():
        async with build_loop(cfg, out_dir=tmp_path / "run") as loop:
            assert [next(iter(e.pool["k"].devices())) for e in loop.engine.engines] == jax.local_devices()[:2]
            outcome = await loop.step()
            return outcome, loop.engine.stats(), [e.version for e in loop.engine.engines], loop.judge_engine

    outcome, stats, versions, judge_engine = asyncio.run(main())
    assert outcome.metrics["groups_started"] >= 2
    m = outcome.metrics  # generation efficiency from the engines' counters
    assert m["rollout/completion_tokens"] > 0 and m["rollout/prefill_tokens"] > 0
    assert m["rollout/completion_tokens_per_s"] == m["rollout/completion_tokens"] / m["time/rollout_s"]
    assert 0 < m["rollout/mean_live_rows"] <= m["rollout/mean_batch_rows"]
    assert m["rollout/cached_prompt_tokens"] >= 0
    assert all(s["admitted"] > 0 for s in stats), stats  # both engines served task groups
    assert versions == [0 if outcome.skipped else 1] * 2
    assert judge_engine is None  # TextCraft labels are programmatic


def test_policy_frozen_judge_keeps_the_initial_weights(tmp_path):
    cfg = load_config([CONFIG], ["model.init_from=null", "train.warmup=false", "env.name=textworld_sync", "env.task_set=sample", "env.difficulties=[]",
                                 "judge.kind=policy_frozen"])

    async def main():
        async with build_loop(cfg, out_dir=tmp_path / "run") as loop:
            judge, policy = loop.judge_engine, loop.engine
            assert judge is not None and all(judge is not e for e in policy.engines)
            initial = np.asarray(judge.params["final_norm"]["scale"])
            new = jax.tree.map(lambda x: x + 1.0, loop.state.params)
            assert policy.load_weights(new) == 1
            return judge.version, initial, np.asarray(judge.params["final_norm"]["scale"]), \
                np.asarray(policy.engines[0].params["final_norm"]["scale"])

    judge_version, before, after, policy_scale = asyncio.run(main())
    assert judge_version == 0
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(policy_scale, before + 1.0, rtol=1e-6)


def test_more_engines_than_devices_is_a_config_error():
    cfg = load_config([CONFIG], [f"rollout.engines={len(jax.local_devices()) + 1}"])
    with pytest.raises(ConfigError, match="rollout.engines"):
        num_engines(cfg, jax.local_devices())
    assert num_engines(load_config([CONFIG], []), jax.local_devices()) == 1  # CPU default: fake devices share cores
    with pytest.raises(ConfigError, match="rollout.engines"):
        load_config([CONFIG], ["rollout.engines=0"])
