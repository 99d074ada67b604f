"""The counterfactual collector on scripted trees: the env budget's soft cap (9, 17, then plain children), 8
isolated branches with mixed programmatic labels, branch 0 committed, the parent's message, the fresh rubric and 8
scores per complete group, and the records feeding rubric-generation credit."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import types

import jax

from sera_jax.agents.judge import ProgrammaticJudge
from sera_jax.agents.launchers.counterfactual import (
    CounterfactualCollector,
    collector_text,
    rank_fork_groups,
)
from sera_jax.agents.records import dumps_tree, loads_tree
from sera_jax.agents.rubric_calls import RubricConfig
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.datums import rubric_datums
from sera_jax.rl.stages import method_config
from tests.agents.rubric_scripts import py, rubric_text, score_text

LAUNCH = py("r = await launch_subagent({'o3_i1': 4})\nprint(r)")
CRAFT = py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made')")
GIVE_UP = py("finish('gave up')")
SUCCEEDS = {0, 2, 5}   # branches of the first group that craft their target


def tc_script(scores):
    """Root: look, delegate three times, finish. First group: branches in SUCCEEDS craft, the others give up;
    second group: everyone gives up; the third delegation's plain child crafts. Scores by branch from ``scores``."""

    def script(info, ids):
        name = info.node_id
        if name.startswith("rubric:"):
            return rubric_text(3, 1)
        if name.startswith("score:"):
            b = int(name.rsplit("#b", 1)[1])
            return scores[b] if "subagent-1-0" in name else score_text(0.0, False)
        if name == "root":
            return [py("print(view_inventory())"), LAUNCH, LAUNCH, LAUNCH, py("finish('ok')")][info.turn]
        m = re.fullmatch(r"root/subagent-(\d)-0(?:#b(\d))?", name)
        step, b = int(m.group(1)), m.group(2)
        if step == 1:
            return CRAFT if int(b) in SUCCEEDS else GIVE_UP
        return GIVE_UP if step == 2 else CRAFT

    return script


def _run_group(task, tok, scores_by_tree, branches=8):
    async def main():
        pool = await start_pool(1)
        try:
            out = []
            for r, scores in enumerate(scores_by_tree):
                gen = ScriptedGenerator(tok, tc_script(scores))
                col = CounterfactualCollector("textcraft", ProgrammaticJudge(), branches=branches)
                tree = await run_tree(task, "textcraft", gen, tok, RuntimeSettings.for_env("textcraft"),
                                      rollout_index=r, pool=pool, launcher=col)
                await col.finalize(tree)
                out.append((tree, gen))
            return out
        finally:
            await pool.close()

    return asyncio.run(main())


GOOD = [score_text(0.9), score_text(0.0, False), score_text(0.8), score_text(0.1), score_text(0.0, False),
        score_text(0.7), "not json", score_text(0.2)]
WORSE = [score_text(0.3), score_text(0.5), score_text(0.8), score_text(0.1), score_text(0.0, False),
         score_text(0.7), score_text(0.4), score_text(0.2)]


def test_budget_branches_labels_commit_and_credit(tc_task, tok):
    (tree, gen), (tree2, _) = _run_group(tc_task, tok, [GOOD, WORSE])
    # Soft cap: 1 → 9 → 17, then the third delegation is a plain child on the shared world.
    assert tree.counterfactual_environment_count == 17
    assert [d.kind for d in tree.delegations] == ["counterfactual", "counterfactual", "default"]
    assert len(tree.fork_groups) == 2 and all(g.complete for g in tree.fork_groups)
    g = tree.fork_groups[0]
    assert [b.success for b in g.branches] == [b in SUCCEEDS for b in range(8)]
    assert [b.selected for b in g.branches] == [True] + [False] * 7
    assert all(b.initial_state == {"inventory": {"raw_o7": 3, "raw_o5": 9, "raw_t6": 1}} for b in g.branches)
    assert g.branches[1].final_state["inventory"]["raw_o5"] == 9
    assert g.branches[2].final_state["inventory"]["o3_i1"] == 4
    # All 8 branch trajectories are children of the root at the same fork step.
    branch_nodes = [tree.nodes[b.trajectory_id] for b in g.branches]
    assert all(n.parent_id == "root" and n.fork_step == 1 and n.fork_group_id == g.id for n in branch_nodes)
    assert [n.branch_index for n in branch_nodes] == list(range(8))
    # Branch 0 committed: exactly one craft reached the shared world (4 o3_i1, 7 raw_o5).
    assert tree.root.turns[1].output == collector_text(branch_nodes[0], 8) + "\n"
    assert tree.root.turns[1].output.startswith("made\n\nSelected branch: 0; counterfactual branches collected: 8.")
    assert tree.delegations[0].fork_group_id == g.id and len(tree.delegations[0].child_ids) == 8
    # Third delegation: one plain child crafts from 7 raw_o5 after both commits.
    plain = tree.nodes["root/subagent-3-0"]
    assert plain.task_misc["initial_inventory"]["raw_o5"] == 7 and plain.env_labels["success"] == 1.0
    # Post hoc: one fresh rubric (temperature 1.0) and 8 scoring calls (temperature 0) per complete group.
    assert g.rubric is not None and g.rubric_turn.completion_ids and len(g.score_turns) == 8
    assert [b.score for b in g.branches] == [0.9, 0.0, 0.8, 0.1, 0.0, 0.7, None, 0.2]
    assert tree.misc["rubric_stats"] == {"groups": 2, "complete": 2, "rubric_invalid": 0, "scores": 15,
                                         "score_invalid": 1}
    prompt = tok.decode(g.rubric_turn.prompt_ids)
    assert '"branch_index": 0' in prompt and f'"fork_group_id": "{g.id}"' in prompt
    assert "launch_subagent({'o3_i1': 4})" in prompt and '"raw_o5": 9' in prompt
    assert loads_tree(dumps_tree(tree)) == tree
    # The records alone suffice to rank the groups again (e.g. with another policy version's scorer).
    again = loads_tree(dumps_tree(tree))
    side = types.SimpleNamespace(tree=again, generator=ScriptedGenerator(tok, tc_script(WORSE)), tokenizer=tok,
                                 root_key=jax.random.key(5), settings=RuntimeSettings.for_env("textcraft"))
    asyncio.run(rank_fork_groups(again, side, RubricConfig()))
    assert [b.score for b in again.fork_groups[0].branches] == [0.3, 0.5, 0.8, 0.1, 0.0, 0.7, 0.4, 0.2]
    assert again.fork_groups[0].rubric == g.rubric and len(again.fork_groups[0].score_turns) == 8
    # Credit: the second group is homogeneous (all failed) → not ranked; the first is.
    ds = rubric_datums([tree])
    assert len(ds) == 1 and ds[0].group_id == g.id and ds[0].reward == 0.0  # every success beats every failure
    d = ds[0]
    n = len(g.rubric_turn.prompt_ids)
    assert d.tokens == tuple(g.rubric_turn.prompt_ids) + tuple(g.rubric_turn.completion_ids)
    assert d.mask == (0,) * n + (1,) * len(g.rubric_turn.completion_ids) and d.traj_depth == 1
    credit = task_group_credit("rubric_generation", [tree, tree2], method_config("SERA"))
    assert credit.accepted and len(credit.datums) == 2
    adv = [x.advantage for x in credit.datums]
    assert adv[0] > 0 > adv[1] and abs(adv[0] + adv[1]) < 1e-9


def test_branching_factor_below_eight_is_ranked_and_trained(tc_task, tok):
    """A group launched with ``branches=4`` (the tiny default's ``method.branching_factor``) is complete with its 4
    branches: it gets a fresh rubric, 4 scores and a rubric datum. (Completeness once required exactly 8 branches,
    so no group of a smaller branching factor was ever ranked and every rubric-generation step was skipped.)"""
    (tree, _), = _run_group(tc_task, tok, [GOOD[:4]], branches=4)
    g = tree.fork_groups[0]
    assert len(g.branches) == 4 and g.num_branches == 4 and g.complete
    assert [b.success for b in g.branches] == [b in SUCCEEDS for b in range(4)]
    assert g.rubric is not None and len(g.score_turns) == 4
    assert [b.score for b in g.branches] == [0.9, 0.0, 0.8, 0.1]
    # Budget 1 → 5 → 9 → 13 (< 17): all three delegations fork, and every group is ranked.
    assert tree.counterfactual_environment_count == 13 and len(tree.fork_groups) == 3
    assert tree.misc["rubric_stats"]["complete"] == 3 and tree.misc["rubric_stats"]["rubric_invalid"] == 0
    back = loads_tree(dumps_tree(tree))
    assert back == tree and back.fork_groups[0].complete
    ds = rubric_datums([tree])  # the other groups (everyone gives up / everyone crafts) are homogeneous
    assert len(ds) == 1 and ds[0].group_id == g.id and ds[0].reward == 0.0
    # A group that lost a branch is incomplete whatever its factor.
    assert not dataclasses.replace(g, branches=g.branches[:3]).complete


def test_budget_vector():
    col = CounterfactualCollector("textcraft", ProgrammaticJudge())
    assert col.created == 1 and col.reserve() and col.created == 9
    assert col.reserve() and col.created == 17 and not col.reserve() and col.created == 17


def test_concurrent_launches_from_one_cell_overwrite(tc_task, tok):
    """Spec §14: two launches gathered in one cell each get a fork group in call order (9, then 17); both fork the
    same world and each branch-0 commit replaces the whole shared inventory, so the first group's craft is erased
    by the second's (4 o3_i1 in the end, not 8). Kept as in the reference, and documented in the module."""
    cell = py("import asyncio\nr = await asyncio.gather(launch_subagent({'o3_i1': 4}), "
              "launch_subagent({'o3_i1': 4}))\nprint(view_inventory())")

    def script(info, ids):
        if info.node_id == "root":
            return [cell, py("finish('ok')")][info.turn]
        if info.node_id.startswith(("rubric:", "score:")):
            return "{}"
        return CRAFT

    async def main():
        pool = await start_pool(1)
        try:
            col = CounterfactualCollector("textcraft", ProgrammaticJudge())
            return await run_tree(tc_task, "textcraft", ScriptedGenerator(tok, script), tok,
                                  RuntimeSettings.for_env("textcraft"), pool=pool, launcher=col), col
        finally:
            await pool.close()

    tree, col = asyncio.run(main())
    assert col.created == 17 and [g.parent_id for g in tree.fork_groups] == ["root", "root"]
    assert all(all(b.success for b in g.branches) for g in tree.fork_groups)
    assert "'o3_i1': 4" in tree.root.turns[0].output and "'raw_o5': 7" in tree.root.turns[0].output
