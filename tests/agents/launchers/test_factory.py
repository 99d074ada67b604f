"""The launcher factory as train.py / evaluate.py use it with ``run_trees``: stage → launcher, ``finalize`` completing
the records, and those records feeding ``task_group_credit`` (TextWorld, in-process worlds)."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.agents.judge import PolicyJudge, ProgrammaticJudge
from sera_jax.agents.launchers.base import DefaultLauncher
from sera_jax.agents.launchers.best_of_n import BestOfNSelector
from sera_jax.agents.launchers.counterfactual import CounterfactualCollector
from sera_jax.agents.launchers.factory import make_launcher_factory, usable_trees
from sera_jax.agents.launchers.rubric import RubricCoordinator
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.stages import method_config
from tests.agents.rubric_scripts import (
    TW_CHILD,
    TW_CHILD_REPLIES,
    TW_ROOT,
    rubric_text,
    score_text,
)

SERA = method_config("SERA")


def test_stage_to_launcher(tw_task):
    def one(stage, method=SERA, **kw):
        return make_launcher_factory(stage, method, "textcraft", **kw)(tw_task, 0)

    assert isinstance(one("execution"), RubricCoordinator)
    assert isinstance(one("execution", method_config("RAO")), DefaultLauncher)
    assert isinstance(one("delegation"), DefaultLauncher)
    col = one("rubric_generation")
    assert isinstance(col, CounterfactualCollector) and isinstance(col.judge, ProgrammaticJudge)
    assert (col.branches, col.max_envs) == (8, 16)
    assert isinstance(one("evaluation"), DefaultLauncher)
    sel = one("evaluation", selection={"n": 2})
    assert isinstance(sel, BestOfNSelector) and (sel.n, sel.fork_budget) == (2, 32)
    with pytest.raises(ValueError, match="needs a judge"):
        make_launcher_factory("rubric_generation", SERA, "textworld_sync")
    with pytest.raises(ValueError):
        make_launcher_factory("sampling", SERA, "textcraft")


def _trees(task, tok, factory, script, n=2):
    gen = ScriptedGenerator(tok, script)

    async def main():
        trees = await run_trees([task], "textworld_sync", gen, tok, RuntimeSettings.for_env("textworld_sync"),
                                rollouts_per_task=n, launcher_factory=factory)
        return await factory.finalize(trees)

    return asyncio.run(main())


def test_execution_stage_scores_feed_execution_credit(tw_task, tok):
    def script(info, ids):
        if info.node_id.startswith("rubric:"):
            return rubric_text()
        if info.node_id.startswith("score:"):
            return score_text(0.7)
        return {"root": TW_ROOT, TW_CHILD: TW_CHILD_REPLIES}[info.node_id][info.turn]

    factory = make_launcher_factory("execution", SERA, "textworld_sync")
    trees = usable_trees(_trees(tw_task, tok, factory, script))
    assert len(trees) == 2 and all(t.nodes[TW_CHILD].rubric_score.score == 0.7 for t in trees)
    credit = task_group_credit("execution", trees, SERA, env="textworld_sync")
    sub = [d for d in credit.datums if d.node_id == TW_CHILD]
    # Equal roots → baseline = the root reward; the sub-agent's datum carries score − baseline.
    root_r = trees[0].root.env_labels["success"]
    assert sub and all(abs(d.advantage - (0.7 - root_r)) < 1e-9 for d in sub)


def test_textworld_rubric_stage_with_a_frozen_policy_judge(tw_task, tok):
    def judge_script(info, ids):
        text = tok.decode(ids)
        if "#b7" in info.node_id:
            return "cannot tell"  # this branch's label fails: it is excluded from the ranking
        return '{"success": %s, "reason": "r"}' % ("true" if "take white onion</action>" in text else "false")

    judge = PolicyJudge(ScriptedGenerator(tok, judge_script), tok)

    def script(info, ids):
        name = info.node_id
        if name.startswith("rubric:"):
            return rubric_text()
        if name.startswith("score:"):
            b = int(name.rsplit("#b", 1)[1])
            return score_text(0.9 if b % 2 == 0 else 0.0, b % 2 == 0) if b != 2 else score_text(0.1)
        if name == "root":
            return TW_ROOT[info.turn]
        b = int(name.rsplit("#b", 1)[1])
        action = "take white onion" if b % 2 == 0 else "look around"
        return [f"<action>{action}</action>", "<finish>done</finish>"][info.turn]

    factory = make_launcher_factory("rubric_generation", SERA, "textworld_sync", judge=judge)
    trees = _trees(tw_task, tok, factory, script)
    g = trees[0].fork_groups[0]
    assert [b.success for b in g.branches] == [True, False] * 3 + [True, None]
    assert trees[0].counterfactual_environment_count == 9 and g.complete and g.rubric is not None
    assert trees[0].root.turns[0].output.startswith("done\n\nSelected branch: 0; counterfactual branches collected: 8.")
    assert "[Current Environment Observation]" in trees[0].root.turns[0].output
    # Branch 0 took the onion on its clone; the clone was committed, so the root's world ends in that state.
    assert g.branches[0].final_state != g.branches[0].initial_state
    credit = task_group_credit("rubric_generation", trees, SERA, env="textworld_sync")
    # Each tree: one ranked group with the (0.1 success vs 0.0 failure) pairs violating the margin.
    assert credit.accepted and len(credit.datums) == 2 and all(d.trainable for d in credit.datums)
