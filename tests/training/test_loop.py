"""The training loop: group collection and replacement, skipped steps, a real step on scripted TextCraft trees,
checkpoint at every version, and a resumed run whose next step equals the uninterrupted run's."""

from __future__ import annotations

import asyncio
import hashlib

import jax
import numpy as np
import pytest

from envs_py.textcraft import load_tasks
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.model import Qwen3Config, init_params
from sera_jax.model.tokenizer import load_tokenizer
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.rl.stages import method_config
from sera_jax.training.checkpoint import Checkpointer
from sera_jax.training.loop import Loop, generation_metrics
from sera_jax.training.metrics import MetricsWriter, read_metrics
from sera_jax.training.step import init_train_state, make_train_step
from sera_jax.training.task_stream import TaskStream
from tests.model.tokenizer_fixtures import build_qwen_like_tokenizer


# ---------------------------------------------------------------------------------------------- real loop
def py(code):
    return f"<thought>go</thought>\n<python>{code}</python>"


SOLVE = [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))"),
         py("print(craft({'raw_o7': 1, 'o3_i1': 1}, ('o5_i2_15', 3)))\nfinish('done')")]
GIVE_UP = [py("print(view_inventory())"), py("finish('gave up')")]


def script(info, prompt_ids):
    # Half of the rollouts solve the task: a deterministic function of the tree id, so runs replay.
    solve = int(hashlib.sha256(info.tree_id.encode()).hexdigest(), 16) % 2 == 0
    replies = SOLVE if solve else GIVE_UP
    return replies[min(info.turn, len(replies) - 1)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tok = load_tokenizer(build_qwen_like_tokenizer(tmp_path_factory.mktemp("loop_tok")))
    cfg = Qwen3Config.preset("tiny", vocab_size=1024, num_layers=1)
    assert tok.vocab_size <= cfg.vocab_size
    task = load_tasks("val")[0]
    return tok, cfg, task


def _loop(world, out_dir, *, every=1):
    tok, cfg, task = world
    tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0))
    state = init_train_state(init_params(jax.random.key(0), cfg), tx)
    settings = RuntimeSettings.for_env("textcraft", deterministic=True, seed=1)
    published = []

    async def run_group(task_, stage, version):
        gen = ScriptedGenerator(tok, script, policy_version=version, latency_s=0.05)
        return await run_trees([task_], "textcraft", gen, tok, settings, rollouts_per_task=4)

    return Loop(state=state, step_fn=make_train_step(cfg, tx), publish=lambda p: published.append(1) or 0,
                run_group=run_group, tasks=[task, task], method=method_config("rao"), stream=TaskStream(2, seed=5, ranks=2),
                env="textcraft", decode=tok.decode, mesh=None, tasks_per_step=2,
                token_budget=8192, buckets=(2048, 4096), deterministic=True, min_trainable=1,
                checkpointer=Checkpointer(out_dir / "ck", every=every), metrics=MetricsWriter(out_dir),
                key=jax.random.key(9), trees_dir=out_dir / "trees")


@pytest.mark.slow
def test_loop_trains_checkpoints_and_resumes_exactly(world, tmp_path):
    straight = _loop(world, tmp_path / "a")
    outs = asyncio.run(straight.run(2))
    assert [o.skipped for o in outs] == [False, False] and straight.version == 2
    m = outs[0].metrics
    assert m["groups_accepted"] == 2 and m["trainable_datums"] > 0 and m["loss_tokens"] > 0
    assert m["grad_norm"] > 0 and m["update_norm"] > 0
    # tree-level metrics: the script solves half of the rollouts; nobody delegates; TextCraft labels programmatic
    assert 0.0 < m["root_success"] < 1.0 and m["delegation_rate"] == 0.0 and m["nodes_per_tree"] == 1.0
    assert m["supervision/programmatic_labels"] == 0 and m["supervision/judge_calls"] == 0
    # Wall time by phase: 8 trees × 2 turns of ≥ 50 ms generation (the loop's trace reached every tree without being
    # passed in); the 4 trees of a group run at once and the 2 groups may overlap (one per rank, 2 ranks), so the wall
    # time of generation is at least one tree's 2 turns and less than the busy sum; phases lie within the rollout;
    # the attempt covers all parts.
    assert m["time/generation_busy_s"] >= 8 * 2 * 0.05 and m["time/generation_s"] >= 2 * 0.05
    assert m["time/generation_s"] < m["time/generation_busy_s"] and m["time/env_busy_s"] > 0
    for p in ("generation", "env", "scoring"):
        assert 0 <= m[f"time/{p}_s"] <= m[f"time/{p}_busy_s"] + 1e-9 and m[f"time/{p}_s"] <= m["time/rollout_s"]
    assert m["time/scoring_s"] == 0.0 and m["time/rollout_uncovered_s"] >= 0
    assert m["time/step_s"] >= m["time/rollout_s"] + m["time/train_s"] + m["time/publish_s"] > 0
    from sera_jax.agents.records import read_jsonl
    written = sorted((tmp_path / "a" / "trees").glob("*.jsonl"))
    assert len(written) == 2 and len(list(read_jsonl(written[0]))) == m["trees"]
    records = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert [r["version"] for r in records] == [1, 2] and records[0]["stage"] == "execution"
    assert (tmp_path / "a" / "tensorboard").is_dir()

    # A run "killed" after version 1 (nothing saved at exit) resumes from the version-1 checkpoint.
    first = _loop(world, tmp_path / "b")
    asyncio.run(first.step())
    first.checkpointer.wait()
    resumed = _loop(world, tmp_path / "b")
    assert resumed.restore_latest() and resumed.version == 1
    assert resumed.stream.to_json() == first.stream.to_json()
    nxt = asyncio.run(resumed.step())
    for k in ("loss", "grad_norm", "loss_tokens", "mean_ratio"):
        assert nxt.metrics[k] == outs[1].metrics[k], k
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(straight.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_untrainable_step_is_skipped_and_does_not_advance(world, tmp_path):
    loop = _loop(world, tmp_path)
    loop.min_trainable = 10_000  # more than the trainable datums
    out = asyncio.run(loop.step())
    assert out.skipped and "one per rank" in out.reason and loop.version == 0 and loop.skipped_steps == 1
    for a, b in zip(jax.tree.leaves(loop.state.params), jax.tree.leaves(_loop(world, tmp_path / "x").state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_stage_can_take_fewer_task_groups(world, tmp_path):
    # rollout.rubric_stage_tasks_per_step reaches the loop as a per-stage override of tasks_per_step (2 here)
    loop = _loop(world, tmp_path)
    loop.stage_tasks_per_step = {"execution": 1}
    out = asyncio.run(loop.step())
    assert not out.skipped and loop.version == 1 and out.metrics["groups_accepted"] == 1
    loop.stage_tasks_per_step = {"rubric_generation": 1}  # another stage's override leaves execution at 2
    assert asyncio.run(loop.step()).metrics["groups_accepted"] == 2


@pytest.mark.parametrize("ofp", [pytest.param(0, marks=pytest.mark.slow), 3])
def test_no_trained_token_is_older_than_the_staleness_bound(world, tmp_path, ofp):
    # The sampler's version moves with every publish; with ofp = 3 (TextCraft RAO, one group per rank) each rank's
    # next group starts before the update and generates through it, so its tokens lag by ≤ 1 version; with ofp = 0
    # nothing runs across an update and no token lags.
    loop = _loop(world, tmp_path)
    published = [0]

    class LiveVersion(ScriptedGenerator):
        async def generate(self, prompt_ids, params, key=None):
            self.policy_version = published[0]  # the weights the engine holds when this turn is sampled
            return await super().generate(prompt_ids, params, key)

    async def run_group(task_, stage, version):
        gen = LiveVersion(loop.tokenizer_, script, latency_s=0.02)
        return await run_trees([task_], "textcraft", gen, loop.tokenizer_, RuntimeSettings.for_env(
            "textcraft", deterministic=True, seed=1), rollouts_per_task=4)

    def publish(params):
        published[0] += 1
        return published[0]

    loop.tokenizer_ = world[0]
    loop.run_group, loop.publish = run_group, publish
    loop.max_offpolicyness, loop.deterministic = ofp, False
    outs = asyncio.run(loop.run(2))
    assert [o.skipped for o in outs] == [False] * 2
    lags = [o.metrics.get("staleness_max", 0.0) for o in outs]
    assert all(0 <= lag <= min(ofp, 1) for lag in lags)
    if ofp:
        assert max(lags) == 1 and all(o.metrics["groups_carried"] == 2 for o in outs)
    else:
        assert all(o.metrics["groups_carried"] == 0 for o in outs)


def test_generation_metrics_are_counter_deltas_over_engines():
    before = [{"generated_tokens": 10, "decode_calls": 2, "decode_live_rows": 6, "decode_batch_rows": 8,
               "prefill_tokens": 100, "cached_tokens": 0}, {}]
    after = [{"generated_tokens": 70, "decode_calls": 4, "decode_live_rows": 9, "decode_batch_rows": 16,
              "prefill_tokens": 400, "cached_tokens": 64},
             {"generated_tokens": 30, "decode_calls": 1, "decode_live_rows": 4, "decode_batch_rows": 4}]
    m = generation_metrics(before, after, seconds=4.0)
    assert m["rollout/completion_tokens"] == 90 and m["rollout/completion_tokens_per_s"] == 22.5
    assert m["rollout/prefill_tokens"] == 300 and m["rollout/cached_prompt_tokens"] == 64
    assert m["rollout/mean_live_rows"] == 7 / 3 and m["rollout/mean_batch_rows"] == 12 / 3


def test_the_configured_advantage_clip_reaches_the_packed_batch(world, tmp_path, monkeypatch):
    # batch.advantage_clip travels Loop → build_batch → pack_datums: the same scripted step packed under clip 20 and
    # under a clip far below its advantages (RAO root LOO: ±0.5 and more) gives different packed advantages.
    import sera_jax.training.loop as loop_module

    packed = []

    def capture(groups, method, **kw):
        batch, info = loop_module_build_batch(groups, method, **kw)
        packed.append((kw["advantage_clip"], np.asarray(batch.advantages)))
        return None, {**info, "reason": "captured"}  # skip the update: only the batch matters here

    loop_module_build_batch = loop_module.build_batch
    monkeypatch.setattr(loop_module, "build_batch", capture)
    for clip in (20.0, 0.01):
        loop = _loop(world, tmp_path / str(clip))
        loop.advantage_clip = clip
        assert asyncio.run(loop.step()).reason == "captured"
    (wide, a), (narrow, b) = packed
    assert (wide, narrow) == (20.0, 0.01)
    assert np.abs(a).max() > 0.01 and np.abs(b).max() == pytest.approx(0.01) and not np.array_equal(a, b)
    np.testing.assert_array_equal(np.sign(a), np.sign(b))  # the same datums, the same tokens: only clipped
