"""The run's warm-up (``Loop.warmup``, on by ``train.warmup``): every engine shape, the key derivations, the publish
and the train step's shapes compiled before the first attempt, so that an attempt — rollouts, the train step, the
publish — traces and compiles nothing (``compile/*`` metrics), and the engine's busy fraction is reported."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.config import load_config
from sera_jax.training.build import build_loop
from sera_jax.rl.shapes import micro_batch_count

SMALL = ["model.init_from=null", "train.warmup=true", "rollout.tasks_per_step=1", "rollout.trees_per_task=2",
         "rollout.speculative_groups_per_rank=0", "rollout.context_tokens=256", "rollout.max_prompt_tokens=192",
         "rollout.max_completion_tokens=64", "batch.buckets=[256]", "batch.token_budget=512",
         "method.execution_filter_zero_variance_groups=false", "env.max_steps=2", "env.num_workers=1",
         "train.warmup_micro_batches=[1,2]"]


@pytest.mark.slow
def test_an_attempt_after_the_warm_up_traces_and_compiles_nothing(tmp_path):
    cfg = load_config(["configs/tiny_cpu.yaml"], SMALL)

    async def go():
        async with build_loop(cfg, out_dir=tmp_path) as loop:
            loop.step_fn.wait_warm()  # the step compiles in the background while the first rollout runs
            assert len(loop.step_fn.executables) == 2  # the one bucket at 1 and 2 micro-batches, ahead of time
            return await loop.step()

    outcome = asyncio.run(go())
    m = outcome.metrics
    assert not outcome.skipped, outcome.reason  # rollouts, the train step and the publish all ran
    assert m["compile/traces"] == 0 and m["compile/compiles"] == 0, m
    assert 0 < m["rollout/engine_busy_fraction"] <= 1.05
    assert m["agents/lifetime_s"] > 0
    assert m["agents/engine_s"] + m["agents/env_s"] + m["agents/children_s"] + m["agents/host_s"] == \
        pytest.approx(m["agents/lifetime_s"])


def test_a_steps_micro_batches_are_padded_to_the_smallest_warmed_count():
    warmed = (1, 2, 3, 4)
    assert [micro_batch_count(n, warmed) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]  # 3 runs as 3, not 4
    assert micro_batch_count(3, (1, 2, 4)) == 4
    assert micro_batch_count(5, warmed) == 8 and micro_batch_count(9, warmed) == 16  # beyond: powers of two
    assert [micro_batch_count(n) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]  # nothing warmed
