"""Trees → datums (docs/design/algorithm.md §2), including the §5.4 delegation example end to end with a real tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from rl_builders import node, tree, turn
from sera_jax.agents.records import Branch, ForkGroup, RubricScore
from sera_jax.rl.baselines import assign_delegation_advantages, assign_execution_advantages
from sera_jax.rl.datums import delegation_datums, execution_datums, merge_turns, rubric_datums


def test_prefix_merging_appends_only_new_prompt_suffixes():
    t0 = turn(0, [1, 2, 3], [10, 11])
    t1 = turn(1, [1, 2, 3, 10, 11, 4, 5], [12])           # extends: only [4, 5] are new
    t2 = turn(2, [1, 2, 9], [13, 14])                      # truncated history: new sequence
    t3 = turn(3, [1, 2, 9, 13, 14, 6], [15])
    (a, b) = merge_turns([t0, t1, t2, t3])
    assert a[0] == [1, 2, 3, 10, 11, 4, 5, 12]
    assert a[1] == [0, 0, 0, 1, 1, 0, 0, 1]
    assert a[2] == [0.0, 0.0, 0.0, *t0.logprobs, 0.0, 0.0, *t1.logprobs]
    assert a[3] == [-1, -1, -1, 3, 3, -1, -1, 3]
    assert b[0] == [1, 2, 9, 13, 14, 6, 15] and b[1] == [0, 0, 0, 1, 1, 0, 1]


def test_execution_datums_rewards_filters_and_depth_metadata():
    root = node("r", turns=[
        turn(0, [1, 2], [3, 4]),
        turn(1, [1, 2, 3, 4, 5], [6], error="NameError: x"),          # error step of a successful root: skipped
        turn(2, [1, 2, 3, 4, 5, 6, 7], [8], output="Traceback (most recent call last)"),  # skipped too
        turn(3, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10], completion_id=None),  # loop breaker: no datum
        turn(4, [1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12]),
    ], success=1.0)
    scored = node("s", parent="r", fork_step=0, depth=1, turns=[
        turn(0, [20], [21], error="boom", reward_misc={"reward/filter_success": 0.0}),  # filter flag 0: kept
        turn(1, [20, 21, 22], [23], reward_misc={"reward/code_success": 1.0, "reward/success": 0.6,
                                                 "reward/filter_success": 0.0})],
        rubric_score=RubricScore(0.6, False, 1.0))
    dropped = node("d", parent="r", fork_step=0, depth=1, turns=[turn(0, [30], [31])], success=1.0,
                   skip_gradient_update=True)
    unscored = node("u", parent="s", fork_step=1, depth=2, turns=[turn(0, [40], [41])], success=1.0)
    t = tree("t", [root, scored, dropped, unscored], index=2)
    ds = execution_datums(t, mode="rubric")
    assert [(d.node_id, d.traj_depth, d.traj_start, d.reward) for d in ds] == [("r", 0, 1, 1.0),
                                                                               ("s", 1, 1, 0.6)]
    r = ds[0]
    # error completions 6 and 8 come back as prompt context (mask 0) inside the next kept prompt
    assert r.tokens == (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12)
    assert r.mask == (0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1)
    assert r.versions == (-1, -1, 3, 3, -1, -1, -1, -1, -1, 3, 3)
    assert ds[1].tokens == (20, 21, 22, 23) and ds[1].mask == (0, 1, 0, 1)
    assert all(d.rollout_index == 2 and d.objective == "execution" for d in ds)

    rao = execution_datums(t, mode="rao")
    assert [(d.node_id, d.reward) for d in rao] == [("r", 1.0), ("s", 1.0), ("u", 1.0)]
    unfiltered = execution_datums(t, mode="rao", filter_errors=False)
    assert unfiltered[0].mask.count(1) == 6  # 2 + 1 + 1 + 2 completion tokens, loop breaker still excluded


def test_execution_advantages_from_datums_section_5_1():
    roots = [1, 0, 0, 1, 0, 0, 0, 0]
    trees = []
    for i, R in enumerate(roots):
        nodes = [node("r", turns=[turn(0, [1], [2])], success=float(R))]
        if i == 0:
            nodes.append(node("s", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])],
                              rubric_score=RubricScore(0.7, True, 1.0)))
        trees.append(tree(f"t{i}", nodes, index=i))
    ds = [d for t in trees for d in execution_datums(t)]
    adv = assign_execution_advantages(ds, roots)
    got = {(d.rollout_index, d.node_id): d.advantage for d in adv}
    assert got[(0, "r")] == pytest.approx(0.857143, abs=1e-6)
    assert got[(0, "s")] == pytest.approx(0.557143, abs=1e-6)
    assert got[(1, "r")] == pytest.approx(-0.285714, abs=1e-6)


def _launch_turn(bpe, index, code, *, completion_id="auto"):
    text = f"<thought>delegate</thought>\n<python>{code}</python><|im_end|>"
    return turn(index, bpe.encode(f"<|im_end|>task {index}").ids, bpe.encode(text).ids, code=code, text=text,
                completion_id=completion_id)


def _plain_turn(bpe, index):
    code = 'print(view_inventory())'
    text = f"<thought>look</thought>\n<python>{code}</python>"
    return turn(index, [5], bpe.encode(text).ids, code=code, text=text)


def test_delegation_section_5_4_end_to_end(bpe, decode):
    L = 'r = await asyncio.gather(launch_subagent({"a": 1}), launch_subagent({"b": 1}))\nprint(r)'
    one = 'x = await launch_subagent({"c": 1})'
    unawaited = 'launch_subagent({"b1": 1})'
    trees = [
        tree("t0", [node("root", turns=[_launch_turn(bpe, 0, L), _plain_turn(bpe, 1)], success=1.0),
                    node("A", parent="root", fork_step=0, depth=1, turns=[_launch_turn(bpe, 0, one)]),
                    node("A1", parent="A", fork_step=0, depth=2, turns=[_plain_turn(bpe, 0)]),
                    node("B", parent="root", fork_step=0, depth=1,
                         turns=[_plain_turn(bpe, 0), _launch_turn(bpe, 1, unawaited)])], index=0),
        tree("t1", [node("root", turns=[_launch_turn(bpe, 0, one)], success=1.0),
                    node("C", parent="root", fork_step=0, depth=1, turns=[_plain_turn(bpe, 0)])], index=1),
        tree("t2", [node("root", turns=[_launch_turn(bpe, 0, one)], success=0.0),
                    node("D", parent="root", fork_step=0, depth=1, turns=[_plain_turn(bpe, 0)])], index=2),
    ] + [tree(f"t{i}", [node("root", turns=[_plain_turn(bpe, 0)], success=0.0)], index=i) for i in range(3, 8)]
    per_tree = [delegation_datums(t, decode) for t in trees]
    assert [len(x) for x in per_tree] == [3, 1, 1, 0, 0, 0, 0, 0]
    r0 = per_tree[0]
    assert [(d.node_id, d.reward, d.meta["invalid"], d.traj_depth, d.traj_start) for d in r0] == [
        ("root", 1.0, False, 0, 1), ("A", 0.5, False, 1, 1), ("B", 0.0, True, 1, 1)]
    adv = assign_delegation_advantages([d for x in per_tree for d in x], num_rollouts=8)
    np.testing.assert_allclose([d.advantage for d in adv], [0.857143, 0.357143, -0.142857, 0.928571, -0.214286],
                               atol=1e-6)
    # masks: only the launch statement's tokens, and the datum ends at its last masked token
    d = r0[0]
    t = trees[0].nodes["root"].turns[0]
    n_prompt = len(t.prompt_ids)
    assert d.tokens[:n_prompt] == tuple(t.prompt_ids) and not any(d.mask[:n_prompt])
    assert d.mask[-1] == 1
    trained = [tok for tok, m in zip(d.tokens, d.mask) if m]
    stmt = L.split("\n")[0]
    assert stmt in decode(trained) and "print(r)" not in decode(trained)
    assert len(d.tokens) < n_prompt + len(t.completion_ids)  # "\nprint(r)</python>..." was cut
    k = d.mask.index(1)
    assert d.logprobs[k] == t.logprobs[k - n_prompt] and d.versions[k] == t.policy_version
    assert assign_delegation_advantages(r0, num_rollouts=1) == []


def test_delegation_skips_missing_completion_and_unplaceable_code(bpe, decode):
    code = 'x = await launch_subagent({"c": 1})'
    lost = _launch_turn(bpe, 0, code, completion_id=None)
    moved = _launch_turn(bpe, 1, code)
    moved.code = 'y = await launch_subagent({"zzz": 9})'  # not in the completion text: no mask
    mention = _launch_turn(bpe, 2, 'print("launch_subagent")')
    t = tree("t", [node("root", turns=[lost, moved, mention], success=1.0),
                   node("K", parent="root", fork_step=0, depth=1)])
    assert delegation_datums(t, decode) == []


def _delegate_turn(bpe, index, goal="open the chest"):
    text = f'Split it.\n<delegate goal="{goal}">take key, unlock chest</delegate>'
    return turn(index, [5], bpe.encode(text).ids, code=text, text=text)


def test_textworld_delegation_emits_no_invalid_attempt_datums(bpe, decode):
    """TextWorld (docs/design/recipes.md §1b, §2): a delegate block that created no child (a refusal at the depth limit) gives
    no datum; the launch event still does. TextCraft keeps its invalid-attempt datums (§5.4)."""
    t = tree("t", [node("root", turns=[_delegate_turn(bpe, 0), _delegate_turn(bpe, 1)], success=1.0),
                   node("c", parent="root", fork_step=0, depth=1, turns=[_delegate_turn(bpe, 0)])])
    tw = delegation_datums(t, decode, env="textworld_sync")
    assert [(d.node_id, d.meta["fork_step"], d.meta["invalid"], d.reward) for d in tw] == [("root", 0, False, 1.0)]
    assert not any(d.meta["invalid"] for d in tw)
    one = 'x = await launch_subagent({"c": 1})'
    tc = tree("t", [node("root", turns=[_launch_turn(bpe, 0, one), _launch_turn(bpe, 1, one)], success=1.0),
                    node("c", parent="root", fork_step=0, depth=1)])
    assert [d.meta["invalid"] for d in delegation_datums(tc, decode, env="textcraft")] == [False, True]


def test_textworld_rao_execution_datums_follow_the_judge_label():
    """The tree's recorded env picks the RAO rule: a TW child with the judge's label 1 trains with 1 although the
    world check says 0; a TW child without a label (its judge call failed) gives no datum; TextCraft: env check."""
    def build(env):
        nodes = [node("r", turns=[turn(0, [1], [2])], success=0.0),
                 node("a", parent="r", fork_step=0, depth=1, turns=[turn(0, [3], [4])], success=0.0,
                      env_labels={"judge_success": 1.0}),
                 node("b", parent="r", fork_step=0, depth=1, turns=[turn(0, [5], [6])], success=1.0)]
        return tree("t", nodes, misc={"env": env})

    assert {d.node_id: d.reward for d in execution_datums(build("textworld_sync"), mode="rao")} == {"r": 0.0, "a": 1.0}
    assert {d.node_id: d.reward for d in execution_datums(build("textcraft"), mode="rao")} == {
        "r": 0.0, "a": 1.0, "b": 1.0}
    assert {d.node_id for d in execution_datums(build("textcraft"), mode="rao", env="textworld_sync")} == {"r", "a"}


def _group(gid, scores, labels, bpe, *, depth=1, skipped=False, rubric=True):
    rt = turn(0, bpe.encode("write a rubric").ids, bpe.encode('{"rubric_items": []}').ids)
    scorer = [turn(1, [1400 + b], [1500 + b, 1600 + b]) for b in range(len(scores))]  # ids the BPE never makes
    return ForkGroup(id=gid, parent_id="root", fork_step=0, child_depth=depth, skipped=skipped, rubric_turn=rt,
                     score_turns=scorer,
                     rubric={"rubric_items": []} if rubric else None,
                     branches=[Branch(b, f"{gid}b{b}", depth, success=y, score=s)
                               for b, (s, y) in enumerate(zip(scores, labels))])


def test_rubric_datums_one_per_ranked_group(bpe):
    S = [0.9, 0.5, 0, 0.4, 0, 0, 0, 0]
    Y = [True, True] + [False] * 6
    t0 = tree("t0", [node("root")], index=0, fork_groups=[
        _group("g0", S, Y, bpe, depth=2),
        _group("g1", S, [True] * 8, bpe),            # homogeneous: skipped
        _group("g2", S, Y, bpe, rubric=False),       # invalid rubric: skipped
        _group("g3", S, Y, bpe, skipped=True)])
    t1 = tree("t1", [node("root")], index=1, fork_groups=[_group("g4", [0.1, 0.9], [True, False], bpe)])
    ds = rubric_datums([t0, t1])
    assert [(d.group_id, d.traj_depth, d.traj_start) for d in ds] == [("g0", 2, 1), ("g4", 1, 1)]
    assert ds[0].reward == pytest.approx(-0.1 / 12, rel=1e-5)
    assert ds[1].reward == pytest.approx(-1.0, rel=1e-6)  # hinge = 0.2 − (0.1 − 0.9)
    rt = t0.fork_groups[0].rubric_turn
    assert ds[0].tokens == tuple(rt.prompt_ids + rt.completion_ids)
    assert sum(ds[0].mask) == len(rt.completion_ids) and ds[0].mask[-1] == 1
    assert not any(tok >= 1400 for d in ds for tok in d.tokens)  # scorer calls are never trained
    rd = rubric_datums([t0], objective="order_discrimination")
    assert rd[0].reward == pytest.approx(0.7983453, abs=1e-6)
    (ph,) = rubric_datums([tree("t2", [node("root")], fork_groups=[_group("g5", S, [False] * 8, bpe)])])
    assert not ph.trainable and ph.tokens == ()
