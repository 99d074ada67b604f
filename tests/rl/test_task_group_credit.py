"""One task group → advantaged datums and the §5.6 accept / reject / non-trainable verdicts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rl_builders import node, tree, turn
from sera_jax.agents.records import Branch, ForkGroup, RubricScore
from sera_jax.rl.baselines import apply_depth_weights, step_rubric_credit, task_group_credit
from sera_jax.rl.stages import method_config

SERA = method_config("SERA")


def _exec_trees(root_successes, sub_score=None):
    out = []
    for i, R in enumerate(root_successes):
        nodes = [node("r", turns=[turn(0, [1, 2], [3, 4])], success=float(R))]
        if sub_score is not None and i == 0:
            nodes.append(node("s", parent="r", fork_step=0, depth=1, turns=[turn(0, [5], [6])], success=1.0,
                              rubric_score=RubricScore(sub_score, sub_score > 0, 1.0)))
        out.append(tree(f"t{i}", nodes, index=99))  # indices are re-numbered from the list order
    return out


def test_execution_group_advantages_and_zero_variance_rules():
    g = task_group_credit("execution", _exec_trees([1, 0, 0, 1, 0, 0, 0, 0], sub_score=0.7), SERA)
    assert g.accepted
    got = {(d.rollout_index, d.node_id): d.advantage for d in g.datums}
    assert got[(0, "r")] == pytest.approx(0.857143, abs=1e-6) and got[(0, "s")] == pytest.approx(0.557143, abs=1e-6)
    assert got[(1, "r")] == pytest.approx(-0.285714, abs=1e-6)
    flat = _exec_trees([1] * 8)
    assert task_group_credit("execution", flat, SERA).accepted is False          # TextCraft: rejected
    tw = task_group_credit("execution", flat, SERA, env="textworld_sync")   # TextWorld: kept and trained (§1b)
    assert tw.accepted and len(tw.datums) == 8 and all(d.trainable for d in tw.datums)
    assert [d.advantage * d.weight for d in apply_depth_weights(tw.datums)] == [0.0] * 8  # zero advantage, in the denominator
    # RAO: the sub-agent's env success (1.0 here), not its score
    rao = task_group_credit("execution", _exec_trees([1, 0], sub_score=0.7), method_config("RAO"))
    assert {d.node_id: d.advantage for d in rao.datums if d.rollout_index == 0} == {"r": 1.0, "s": 1.0}


def _launching(bpe, index, R, launch):
    code = 'x = await launch_subagent({"c": 1})'
    text = f"<python>{code}</python>"
    nodes = [node("r", turns=[turn(0, [7], bpe.encode(text).ids, code=code, text=text)], success=float(R))]
    if launch:
        nodes.append(node("c", parent="r", fork_step=0, depth=1))
    else:
        nodes[0].turns[0].code = "y = 1"
        nodes[0].turns[0].completion_text = "<python>y = 1</python>"
    return tree(f"t{index}", nodes, index=index)


def test_delegation_group_verdicts(bpe, decode):
    trees = [_launching(bpe, 0, 1, True), _launching(bpe, 1, 0, True), _launching(bpe, 2, 1, False)]
    g = task_group_credit("delegation", trees, SERA, decode=decode)
    assert g.accepted
    np.testing.assert_allclose([d.advantage for d in g.datums], [1 - 0 / 2, 0 - 1 / 2])
    flat_method = dataclasses.replace(SERA, launch_advantage_mode="reward_first_flat")
    flat = task_group_credit("delegation", trees, flat_method, decode=decode)
    np.testing.assert_allclose([d.advantage for d in flat.datums], [1.0, -1.0])
    assert not task_group_credit("delegation", trees[2:], SERA, decode=decode).accepted     # G < 2
    none = [_launching(bpe, i, 1, False) for i in range(3)]
    assert not task_group_credit("delegation", none, SERA, decode=decode).accepted          # no launch datum
    same = [_launching(bpe, i, 1, True) for i in range(3)]
    assert not task_group_credit("delegation", same, SERA, decode=decode).accepted          # all-equal advantages
    with pytest.raises(ValueError):
        task_group_credit("delegation", trees, SERA)


def _fork_group(bpe, gid, scores, labels):
    rt = turn(0, [1, 2], bpe.encode('{"rubric_items": []}').ids)
    return ForkGroup(gid, "r", 0, 1, rubric_turn=rt, rubric={"rubric_items": []},
                     branches=[Branch(b, f"{gid}{b}", 1, success=y, score=s)
                               for b, (s, y) in enumerate(zip(scores, labels))])


def test_rubric_group_k1_and_placeholder(bpe):
    def group(gid, scores, labels):
        return _fork_group(bpe, gid, scores, labels)
    one = [tree("t0", [node("r")], fork_groups=[group("g", [0.9, 0.1], [True, False])])]
    (d,) = task_group_credit("rubric_generation", one, SERA).datums
    assert d.trainable and d.advantage == 0.0  # K = 1: emitted with zero advantage (still in the token count)
    empty = task_group_credit("rubric_generation", [tree("t0", [node("r")])], SERA)
    assert empty.accepted and [x.trainable for x in empty.datums] == [False]
    # With rubric_filter_unranked_groups a group without a ranked fork group is rejected; a ranked one still counts.
    strict = dataclasses.replace(SERA, rubric_filter_unranked_groups=True)
    assert not task_group_credit("rubric_generation", [tree("t0", [node("r")])], strict).accepted
    agreed = [tree("t0", [node("r")], fork_groups=[group("g", [0.9, 0.8], [True, True])])]
    assert task_group_credit("rubric_generation", agreed, SERA).accepted
    assert not task_group_credit("rubric_generation", agreed, strict).accepted
    assert task_group_credit("rubric_generation", one, strict).accepted
    with pytest.raises(ValueError):
        task_group_credit("training", one, SERA)


def test_step_scope_rubric_baseline_pools_the_ranked_groups_of_every_task(bpe):
    # Three tasks with one ranked fork group each (K = 1 per task: advantage 0 under the paper's task scope), with
    # the rewards of the §5.2 baseline example; pooled over the step they get that example's advantages.
    y8 = [True, True] + [False] * 6
    tasks = [[tree("a", [node("r")], fork_groups=[_fork_group(bpe, "g", [0.9, 0.5, 0, 0.4, 0, 0, 0, 0], y8)])],
             [tree("b", [node("r")], fork_groups=[_fork_group(bpe, "g", [0.6, 0.5], [True, False])])],
             [tree("c", [node("r")], fork_groups=[_fork_group(bpe, "g", [0.65, 0.5], [True, False])])],
             [tree("d", [node("r")])]]                                  # no ranked group: a placeholder
    groups = [task_group_credit("rubric_generation", t, SERA) for t in tasks]
    assert [d.advantage for g in groups for d in g.datums] == [0.0] * 4
    np.testing.assert_allclose([d.reward for g in groups[:3] for d in g.datums],
                               [-0.1 / 12, -0.1, -0.05], atol=1e-6)
    pooled = step_rubric_credit(groups)
    assert [len(g.datums) for g in pooled] == [1, 1, 1, 1] and all(g.accepted for g in pooled)
    np.testing.assert_allclose([g.datums[0].advantage for g in pooled[:3]], [0.0666667, -0.0708333, 0.0041667],
                               atol=1e-6)
    assert pooled[3].datums[0].trainable is False and pooled[3].datums[0].advantage == 0.0
    assert [d.advantage for g in step_rubric_credit(groups[:1]) for d in g.datums] == [0.0]   # K = 1 in the step
    # The flipped control (method.rubric_advantage_sign = -1): the same advantages, negated, in both scopes.
    flipped = step_rubric_credit(groups, -1.0)
    np.testing.assert_allclose([g.datums[0].advantage for g in flipped[:3]], [-0.0666667, 0.0708333, -0.0041667],
                               atol=1e-6)
    task = dataclasses.replace(SERA, rubric_advantage_sign=-1.0)
    two = [tree("e", [node("r")], fork_groups=[_fork_group(bpe, "g", [0.9, 0.5], [True, False]),
                                                _fork_group(bpe, "h", [0.3, 0.5], [True, False])])]
    plain = [d.advantage for d in task_group_credit("rubric_generation", two, SERA).datums]
    assert plain and any(plain)
    assert [d.advantage for d in task_group_credit("rubric_generation", two, task).datums] == [-a for a in plain]
    with pytest.raises(ValueError, match="rubric_advantage_sign"):
        dataclasses.replace(SERA, rubric_advantage_sign=0.5)
    with pytest.raises(ValueError, match="rubric_baseline_scope"):
        dataclasses.replace(SERA, rubric_baseline_scope="batch")
