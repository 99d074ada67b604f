"""TextWorld sub-agent judge labels (docs/design/recipes.md §1b, §3): the RAO family's execution labels on real TextWorld trees
(a child that completes its own sub-goal while the shared task stays unfinished is rewarded 1 by the judge, not 0 by
the world check; a failed call takes only that sub-agent out of training; every call reaches the supervision
metrics; one attempt; a bounded number in flight; judged once), and the rubric-generation stage's deferred branch
labels (only complete fork groups with a valid rubric are sent to the judge)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from envs_py.textworld_sync import oracle_split_actions
from sera_jax.agents.judge import NO_THINKING, ChatJudge, Label
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.records import Node, Tree, Turn, dumps_tree, loads_tree
from sera_jax.agents.runtime import run_tree, run_trees
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.agents.subagent_judge import (
    SPENT_KEY,
    STATS_KEY,
    DeferredJudge,
    SubagentJudge,
    label_fork_groups,
    label_subagents,
)
from sera_jax.rl import rewards as R
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.datums import execution_datums
from sera_jax.rl.stages import method_config
from sera_jax.training.stats import tree_metrics
from tests.agents.rubric_scripts import TW_ROOT, rubric_text, score_text
from tests.agents.test_judge import ChatServer

C0, C1 = "root/subagent-0-0", "root/subagent-0-1"
OK = '{"success": true, "reason": "its dish was eaten"}'


class OwnGoalJudge:
    """Test-only programmatic per-sub-agent TextWorld check, from the node's own records (TextWorld-Sync has no
    per-sub-goal checker: a delegated goal is free text). A goal that names dishes (``dish_N``) is met iff this
    sub-agent itself ran ``eat dish_N`` for each of them without an error; anything else is a failure. Each label
    counts one request of 100 prompt and 5 completion tokens, so supervision sums can be checked."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []

    async def label(self, node: Node, parent_goal: str = "") -> Label:
        self.asked.append((node.id, parent_goal))
        eaten = {m.group(1) for t in node.turns if not t.error
                 for m in [re.search(r"<action>\s*eat (dish_\d+)\s*</action>", t.code)] if m}
        wanted = set(re.findall(r"dish_\d+", node.goal))
        ok = bool(wanted) and wanted <= eaten
        return Label(ok, f"ate {sorted(eaten)} of {sorted(wanted)}", 1, prompt_tokens=100, completion_tokens=5)


def _dish_script(task) -> dict:
    """The root delegates one dish to each of two children and gives up; child 0 cooks and eats dish_1 (the oracle's
    own steps for it), child 1 tries to eat dish_2 unprepared and gives up. The shared task stays unsolved."""
    body = json.dumps({"delegations": [{"goal": "prepare and eat dish_1"}, {"goal": "prepare and eat dish_2"}]})
    return {"root": [f"<delegate>{body}</delegate>", "<finish>gave up</finish>"],
            C0: [f"<action>{a}</action>" for agent, a in oracle_split_actions(task, 2) if agent == C0]
            + ["<finish>dish_1 eaten</finish>"],
            C1: ["<action>eat dish_2</action>", "<finish>could not</finish>"]}


def _tw_tree(task, tok, rollout_index=0, script=None):
    gen = ScriptedGenerator(tok, script or _dish_script(task))
    settings = RuntimeSettings.for_env("textworld_sync")
    return asyncio.run(run_tree(task, "textworld_sync", gen, tok, settings, rollout_index=rollout_index))


def test_child_that_completes_its_own_subgoal_is_rewarded_by_the_judge_not_the_world(tw_task, tok):
    tree = _tw_tree(tw_task, tok)
    assert set(tree.nodes) == {"root", C0, C1}
    # The world check: the shared task is unfinished, so every node's env success is 0 — child 0's included.
    assert [R.env_success(tree.nodes[n]) for n in ("root", C0, C1)] == [0.0, 0.0, 0.0]
    judge = OwnGoalJudge()
    totals = asyncio.run(label_subagents([tree], judge))
    # Every non-root node judged once, against its own goal, for its immediate parent; the root never.
    assert sorted(judge.asked) == [(C0, tree.root.goal), (C1, tree.root.goal)]
    assert tree.nodes[C0].reward.judge == 1.0 and tree.nodes[C1].reward.judge == 0.0  # the field the reward reads
    assert tree.root.reward.judge is None and tree.nodes[C0].reward.environment == 0.0  # the world check is kept
    assert totals == {"candidates": 2, "labelled": 2, "failed": 0, "calls": 2, "prompt_tokens": 200,
                      "completion_tokens": 10, "unmetered_calls": 0} == tree.misc[STATS_KEY]
    # RAO execution rewards: root = world success (0), child 0 = its judge label 1, child 1 = 0.
    got = {d.node_id: d.reward for d in execution_datums(tree, mode="rao")}
    assert got == {"root": 0.0, C0: 1.0, C1: 0.0}
    # The labels survive the JSONL records and reach the task group's advantages (root LOO baseline, §5.1).
    again = loads_tree(dumps_tree(tree))
    other = _tw_tree(tw_task, tok, rollout_index=1)
    asyncio.run(label_subagents([other], OwnGoalJudge()))
    g = task_group_credit("execution", [again, other], method_config("RAO"), env="textworld_sync")
    assert {(d.rollout_index, d.node_id): d.advantage for d in g.datums}[(0, C0)] == pytest.approx(1.0)
    # TextCraft keeps its programmatic check, and SERA variants their rubric scores: the label is TW RAO's only.
    assert R.execution_reward(tree.nodes[C0], is_root=False, mode="rao", env="textworld_sync") == 1.0


def test_failed_call_drops_only_that_subagents_tokens_and_every_call_is_counted(tw_task, tok):
    """One attempt per sub-agent even with a judge configured for 3 (the RT judge's): child 0's request is answered
    (with usage), child 1's gets a 500 and is not retried, so child 1 leaves training and the tree stays whole."""
    tree = _tw_tree(tw_task, tok)
    srv = ChatServer([("usage", (OK, {"prompt_tokens": 900, "completion_tokens": 12})), ("status", 500)])
    try:
        rt_judge = ChatJudge(srv.url, "kimi-k2.6", max_attempts=3, backoff_s=0.01)
        totals = asyncio.run(SubagentJudge(rt_judge, concurrency=1, max_attempts=1).label_subagents([tree]))
        bodies = [body for _, _, body in srv.requests]
    finally:
        srv.close()
    assert len(bodies) == 2 and rt_judge.max_attempts == 3
    assert all(b[k] == v for b in bodies for k, v in NO_THINKING.items())  # thinking off in every request
    assert bodies[0]["temperature"] == 1.0 and bodies[0]["max_tokens"] == 1024
    assert "Assigned SubAgent Goal:\nprepare and eat dish_1" in bodies[0]["messages"][1]["content"]
    c0, c1 = tree.nodes[C0], tree.nodes[C1]
    assert c0.reward.judge == 1.0 and not c0.skip_gradient_update
    assert c1.reward.judge is None and c1.skip_gradient_update
    assert c1.misc[SPENT_KEY]["success"] is None and "HTTP 500" in c1.misc[SPENT_KEY]["error"]
    assert c1.misc[SPENT_KEY]["calls"] == 1
    # The tree keeps every node, link and turn; only child 1's datums are gone.
    assert set(tree.nodes) == {"root", C0, C1} and c1.parent_id == "root" and c1.turns
    got = {d.node_id for d in execution_datums(tree, mode="rao")}
    assert got == {"root", C0}
    assert totals["failed"] == 1 and totals["labelled"] == 1 and totals["calls"] == 2
    m = tree_metrics([tree], env="textworld_sync")
    assert m["supervision/judge_calls"] == 2 and m["supervision/execution_judge_calls"] == 2
    assert m["supervision/execution_judge_labels"] == 1 and m["supervision/execution_judge_failures"] == 1
    assert m["supervision/judge_labels"] == 1
    assert m["supervision/judge_prompt_tokens"] == 900 == m["supervision/execution_judge_prompt_tokens"]
    assert m["supervision/judge_completion_tokens"] == 12
    assert m["supervision/judge_unmetered_calls"] == 1 == m["supervision/execution_judge_unmetered_calls"]
    # A second pass judges nobody again (each node once): the failed child stays out, no request is made.
    assert asyncio.run(label_subagents([tree], OwnGoalJudge()))["candidates"] == 0


def test_labels_in_flight_are_bounded_and_exceptions_are_failures():
    """16 in flight per rank in the reference: the bound is shared by every tree passed to one SubagentJudge."""
    live, peak = 0, 0

    class Slow:
        async def label(self, node, parent_goal=""):
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.01)
            live -= 1
            if node.id.endswith("boom"):
                raise RuntimeError("endpoint exploded")
            return Label(True, "", 1)

    def tree(tid, n):
        kids = {f"k{i}": Node(id=f"k{i}", goal="g", depth=1, parent_id="root", fork_step=0,
                              turns=[Turn(0, [1], [2], [-0.1], 0, completion_id="c")]) for i in range(n)}
        kids["k0boom"] = Node(id="k0boom", goal="g", depth=1, parent_id="root")
        return Tree(id=tid, task_id="t", root_id="root", nodes={"root": Node(id="root", goal="G"), **kids})

    trees = [tree("a", 5), tree("b", 4)]
    judge = SubagentJudge(Slow(), concurrency=3)
    totals = asyncio.run(judge.label_subagents(trees))
    assert peak == 3 and totals["candidates"] == 11 and totals["failed"] == 2 and totals["labelled"] == 9
    boom = trees[0].nodes["k0boom"]
    assert boom.skip_gradient_update and "RuntimeError: endpoint exploded" in boom.misc[SPENT_KEY]["error"]
    assert boom.misc[SPENT_KEY]["calls"] == 0  # a raising judge reports no request it can vouch for
    # the same object in a new event loop works (its gate is per loop), and no node is judged twice
    assert asyncio.run(judge.label_subagents(trees))["candidates"] == 0
    with pytest.raises(ValueError):
        SubagentJudge(Slow(), concurrency=0)


def test_rt_stage_judges_only_complete_groups_with_a_valid_rubric(tw_task, tok):
    """Two TextWorld rubric-generation trees, one fork group each; tree #1's fresh rubric is invalid. While branches
    run the collector gets DeferredJudge (no request); afterwards only tree #0's 8 branches go to the judge."""
    def script(info, ids):
        name = info.node_id
        if name.startswith("rubric:"):
            return "no rubric here" if "#1:" in name else rubric_text()
        if name.startswith("score:"):
            return score_text(0.5)
        if name == "root":
            return TW_ROOT[info.turn]
        return ["<action>look around</action>", "<finish>done</finish>"][info.turn]

    factory = make_launcher_factory("rubric_generation", method_config("SERA"), "textworld_sync",
                                    judge=DeferredJudge())

    async def main():
        trees = await run_trees([tw_task], "textworld_sync", ScriptedGenerator(tok, script),
                                tok, RuntimeSettings.for_env("textworld_sync"), rollouts_per_task=2,
                                launcher_factory=factory)
        return await factory.finalize(trees)

    trees = asyncio.run(main())
    good, bad = (t.fork_groups[0] for t in trees)
    assert good.complete and good.rubric is not None
    # all 8 branches ran, but the invalid rubric skipped the group
    assert all(b.trajectory_id for b in bad.branches) and len(bad.branches) == 8
    assert bad.rubric is None and bad.skipped
    assert all(b.success is None for g in (good, bad) for b in g.branches)  # nothing labelled yet, nothing spent
    assert tree_metrics(trees, env="textworld_sync")["supervision/judge_calls"] == 0
    judge = OwnGoalJudge()
    totals = asyncio.run(label_fork_groups(trees, judge))
    assert sorted(n for n, _ in judge.asked) == sorted(b.trajectory_id for b in good.branches)
    assert all(p == trees[0].root.goal for _, p in judge.asked)
    assert totals["groups"] == 1 and totals["candidates"] == 8 and totals["calls"] == 8
    assert [b.success for b in good.branches] == [False] * 8 and all(b.success is None for b in bad.branches)
    m = tree_metrics(trees, env="textworld_sync")
    assert m["supervision/judge_labels"] == 8 and m["supervision/judge_calls"] == 8
    assert m["supervision/judge_prompt_tokens"] == 800 and m["supervision/execution_judge_calls"] == 0
    # Labelled branches are not asked again.
    assert asyncio.run(label_fork_groups(trees, judge))["candidates"] == 0 and len(judge.asked) == 8
