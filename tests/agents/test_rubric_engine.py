"""The rubric-stage launchers with the real engine and a tiny random Qwen3: the root is scripted to delegate, and
everything else — children, the 8 branches, rubric writers, scorers, the frozen-policy judge — is whatever the
model writes. All of it must be handled (no crash, no agent error from our side) and counted."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import jax
import pytest

from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.judge import PolicyJudge, frozen_policy_engine
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.runtime import run_trees, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.model import Qwen3Config, init_params
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.stages import method_config
from sera_jax.sampling.engine_config import EngineConfig
from tests.agents.rubric_scripts import TC_ROOT, TW_ROOT

SERA = method_config("SERA")
SMALL = dict(max_rubric_tokens=16, max_scoring_tokens=16,  # CPU-sized calls: prompt cap 1,500 + 16 − 16
             agent_prompt_tokens=1500, agent_completion_tokens=16)


@pytest.fixture(scope="module")
def engine(tok):
    cfg = Qwen3Config.preset("tiny", vocab_size=640)
    ec = EngineConfig(max_batch=8, batch_buckets=(8,), block_size=16, num_blocks=1024, max_context=2048,
                      chunk_steps=8, max_prefill_len=512, max_prefill_batch=2, prefill_batch_buckets=(2,),
                      prefill_len_buckets=(512,), max_prefill_tokens=1024, width_buckets=(128,), dtype="float32")
    params = init_params(jax.random.key(1), cfg)
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 0.05  # sample broadly: exercise every parser
    eng = frozen_policy_engine(cfg, params, ec, tok)
    yield eng
    eng.close()


class RootScripted:
    """The root's turns are scripted (so that it delegates); every other call goes to the engine."""

    def __init__(self, tok, engine, root_script):
        self.scripted, self.engine, self.calls = ScriptedGenerator(tok, {"root": root_script}), engine, []

    async def generate(self, prompt_ids, params, key=None):
        info = CURRENT_TURN.get()
        if info.node_id == "root":  # the scripted root is not held to the engine-sized completion cap
            r = await self.scripted.generate(prompt_ids, dataclasses.replace(params, max_new_tokens=512), key)
        else:
            r = await self.engine.generate(prompt_ids, params, key)
        self.calls.append((info, r))
        return r


def _check(trees):
    for tree in trees:
        assert "error" not in tree.misc
        for n in tree.nodes.values():
            assert not n.rollout_error_zero_reward, n.error_message
            for t in n.turns:
                assert len(t.completion_ids) == len(t.logprobs) and all(math.isfinite(x) for x in t.logprobs)


def test_engine_rubric_generation_stage_textcraft(engine, tok, tc_task):
    settings = RuntimeSettings.for_env("textcraft", max_prompt_tokens=1500, max_context=2048, max_new_tokens=16,
                                       max_steps=2)
    gen = RootScripted(tok, engine, TC_ROOT[1:])
    factory = make_launcher_factory("rubric_generation", SERA, "textcraft", **SMALL)
    before = engine.stats()

    async def main():
        pool = await start_pool(1)
        try:
            trees = await run_trees([tc_task], "textcraft", gen, tok, settings, rollouts_per_task=1, pool=pool,
                                    launcher_factory=factory)
            return await factory.finalize(trees)
        finally:
            await pool.close()

    trees = asyncio.run(main())
    _check(trees)
    tree = trees[0]
    g = tree.fork_groups[0]
    # All 8 branches ran (an invalid fresh rubric then marks the group skipped, so it is no longer "complete").
    assert len(g.branches) == 8 and all(b.trajectory_id for b in g.branches)
    assert g.complete == (g.rubric is not None) and tree.counterfactual_environment_count >= 9
    assert all(b.success in (True, False) for b in g.branches)  # programmatic labels always exist
    stats = tree.misc["rubric_stats"]
    # The random model's rubric is (almost surely) invalid: the group is then skipped; either way it is counted.
    assert stats["complete"] >= 1 and stats["rubric_invalid"] + (stats["scores"] + stats["score_invalid"]) // 8 \
        == stats["complete"]
    assert g.rubric_turn is not None and len(g.rubric_turn.completion_ids) == len(g.rubric_turn.logprobs) > 0
    # The 8 branches' identical first prompts were prefilled once and then read from the prefix cache.
    after = engine.stats()
    assert after["cached_tokens"] - before["cached_tokens"] >= 7 * 100
    credit = task_group_credit("rubric_generation", trees, SERA)
    assert credit.accepted and credit.datums


def test_engine_rubric_coordinator_and_selection_textworld(engine, tok, tw_task):
    settings = RuntimeSettings.for_env("textworld_sync", max_prompt_tokens=1500, max_context=2048,
                                       max_new_tokens=16, max_steps=2)
    results = {}
    for stage, kw in (("execution", SMALL), ("evaluation", {"selection": {"n": 2, "max_scoring_tokens": 16,
                                                                          "max_rubric_tokens": 16}})):
        gen = RootScripted(tok, engine, TW_ROOT)
        factory = make_launcher_factory(stage, SERA, "textworld_sync", **kw)

        async def main():
            trees = await run_trees([tw_task], "textworld_sync", gen, tok, settings, launcher_factory=factory)
            return await factory.finalize(trees)

        results[stage] = asyncio.run(main())
        _check(results[stage])
    child = results["execution"][0].nodes["root/subagent-0-0"]
    st = results["execution"][0].misc["rubric_stats"]
    assert st["children"] == 1 and st["rubric_invalid"] + st["score_invalid"] + st["scored"] == 1
    assert child.skip_gradient_update == (st["scored"] == 0)
    sel = results["evaluation"][0].delegations[0].misc["selection"][0]
    assert len(sel["candidates"]) == 2 and sel["selected"] in (0, 1)
    judge = PolicyJudge(engine, tok, max_new_tokens=16, max_prompt_tokens=1500)
    label = asyncio.run(judge.label(child, "the meal"))
    assert label.success in (True, False, None) and (label.success is not None or label.error)
