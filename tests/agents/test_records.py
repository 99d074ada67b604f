"""Tree records: lossless JSONL round trip and §1.6 tree reconstruction."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
from pathlib import Path

import pytest

from sera_jax.agents.records import (
    Branch,
    DelegationPoint,
    ForkGroup,
    Node,
    Reward,
    RubricScore,
    Tree,
    TreeIndex,
    Turn,
    dumps_tree,
    loads_tree,
    read_jsonl,
    write_jsonl,
)


def _turn(i: int, **kw) -> Turn:
    base = dict(index=i, prompt_ids=[1, 2, 3 + i], completion_ids=[7, 8 + i], logprobs=[-0.1234567890123456, -1e-300],
                policy_version=4, completion_id=f"c{i}", completion_text="<python>x</python><|im_end|>",
                thought="think ü", code="x = await launch_subagent({'a': 1})", output="ok 🌲", error="",
                reward=0.0, reward_misc={"reward/success": 0.0}, misc={"usage": {"prompt_tokens": 3}})
    base.update(kw)
    return Turn(**base)


def _full_tree() -> Tree:
    root = Node(id="r", goal="Craft 1x stick", task_id="textcraft-1", task_misc={"target_items": {"stick": 1},
                "initial_inventory": {"oak_log": 2}}, turns=[_turn(0), _turn(1, logprobs=[-math.inf, 0.5])],
                finish_message="done", env_labels={"success": 1.0}, reward=Reward(environment=1.0))
    child = Node(id="c1", goal="Craft the following items: 4x stick", depth=1, parent_id="r", fork_step=0,
                 turns=[_turn(0, completion_id=None)], error_message="WARNING: Exhausted budget",
                 rubric_score=RubricScore(0.7, True, 0.0, {"rubric_items": []}, {"final_score": 0.7}),
                 reward=Reward(environment=0.0, judge=1.0, rubric_score=0.7), skip_gradient_update=False,
                 rollout_error_zero_reward=True,
                 fork_group_id="g1", branch_index=0, misc={"note": [1, 2.5, None]})
    group = ForkGroup(id="g1", parent_id="r", fork_step=0, child_depth=1, goal="4x stick",
                      branches=[Branch(b, f"c{b}", 1, reward=float(b % 2), success=bool(b % 2),
                                       score=None if b == 3 else 0.1 * b, initial_state={"inventory": {"a": 1}},
                                       final_state={"inventory": {}}, selected=b == 0) for b in range(8)],
                      rubric_turn=_turn(9), rubric={"rubric_items": [{"name": "n", "weight": 0.5}]},
                      score_turns=[_turn(10)])
    return Tree(id="t0", task_id="textcraft-1", root_id="r", nodes={"r": root, "c1": child},
                stage="rubric_generation", root_rollout_index=3, policy_version=4, fork_groups=[group],
                delegations=[DelegationPoint("r", 0, ["c1"], ["4x stick"], "ctx", "counterfactual", "msg", "g1")],
                counterfactual_environment_count=9, misc={"seed": 353})


def test_jsonl_round_trip_is_lossless():
    tree = _full_tree()
    buf = io.StringIO()
    assert write_jsonl([tree, tree], buf) == 2
    back = list(read_jsonl(io.StringIO(buf.getvalue())))
    assert back == [tree, tree]
    # Floats survive bit for bit (json writes repr), -inf included.
    assert back[0].nodes["r"].turns[1].logprobs[0] == -math.inf
    assert back[0].nodes["r"].turns[0].logprobs == [-0.1234567890123456, -1e-300]
    assert dumps_tree(back[0]) == dumps_tree(tree)
    assert back[0].fork_groups[0].complete


def test_jsonl_file_round_trip(tmp_path):
    path = tmp_path / "trees.jsonl"
    write_jsonl([_full_tree()], path)
    write_jsonl([_full_tree()], path)  # appends
    assert [t.id for t in read_jsonl(path)] == ["t0", "t0"]


def test_unknown_fields_are_refused():
    line = dumps_tree(_full_tree()).replace('"stage":', '"stagee": 1, "stage":')
    with pytest.raises(ValueError, match="stagee"):
        loads_tree(line)


def test_turn_logprobs_must_match_tokens():
    with pytest.raises(ValueError):
        Turn(index=0, prompt_ids=[1], completion_ids=[1, 2], logprobs=[0.0], policy_version=0)


def _node(i, parent=None, fork_step=None):
    return Node(id=i, goal="", parent_id=parent, fork_step=fork_step)


def test_tree_reconstruction():
    # root r: children b, a (recorded out of order); a: child a1; a1: child a11; b: leaf; orphan parent id -> root
    nodes = [_node("r"), _node("b", "r", 0), _node("a", "r", 0), _node("a1", "a", 2), _node("a11", "a1", 1)]
    tree = Tree(id="t", task_id="x", root_id="r", nodes={n.id: n for n in nodes})
    idx = TreeIndex.build(tree)
    assert idx.root == "r"
    assert idx.children["r"] == ["a", "b"]
    assert idx.depth == {"r": 0, "a": 1, "b": 1, "a1": 2, "a11": 3}
    assert idx.leaves == ["a11", "b"]
    assert idx.descendant_leaves("r") == ["a11", "b"]
    assert idx.descendant_leaves("a") == ["a11"]
    assert idx.descendant_leaves("b") == ["b"]
    assert idx.subtree("a") == ["a", "a1", "a11"]


def test_childless_root_is_its_own_leaf_and_missing_parent_makes_a_root():
    tree = Tree(id="t", task_id="x", root_id="r", nodes={"r": _node("r")})
    assert TreeIndex.build(tree).leaves == ["r"]
    two = Tree(id="t", task_id="x", root_id="r", nodes={"r": _node("r"), "z": _node("z", "gone", 0)})
    idx = TreeIndex.build(two)
    assert idx.roots == ["r", "z"]
    with pytest.raises(ValueError):
        _ = idx.root


def test_cycle_is_detected():
    nodes = {"a": _node("a", "b"), "b": _node("b", "a")}
    with pytest.raises(ValueError, match="cycle"):
        TreeIndex.build(Tree(id="t", task_id="x", root_id="a", nodes=nodes))


def test_fork_group_completeness():
    g = _full_tree().fork_groups[0]
    assert g.complete
    assert not dataclasses.replace(g, branches=g.branches[:7]).complete
    assert not dataclasses.replace(g, skipped=True).complete


# ------------------------------------------------------------------------------------- records from before Reward

def _old_env_success(node: dict) -> float:
    """The credit code's reading of a node before ``Reward`` (``rl.rewards.env_success`` of that time), on the
    node's JSON dict."""
    if node["rollout_error_zero_reward"]:
        return 0.0
    for key in ("reward/code_success", "reward/success"):
        vals = [t["reward_misc"][key] for t in node["turns"] if key in t["reward_misc"]]
        if vals:
            return float(sum(vals))
    if "success" in node["env_labels"]:
        return float(node["env_labels"]["success"])
    return float(node["reward"] or 0.0)


def _old_execution_reward(node: dict, mode: str) -> float | None:
    if node["skip_gradient_update"]:
        return None
    err = node["rollout_error_zero_reward"]
    if mode == "rao":
        return (0.0 if err else float(node["env_labels"]["judge_success"])) if "judge_success" in node["env_labels"] \
            else _old_env_success(node)
    return None if node["rubric_score"] is None else (0.0 if err else float(node["rubric_score"]["score"]))


def _old_line(tree: Tree, rewards: dict[str, float | None]) -> str:
    """``tree`` as the records were written before ``Reward``: a float (or null) node reward."""
    d = json.loads(dumps_tree(tree))
    for nid, node in d["nodes"].items():
        node["reward"] = rewards[nid]
    return json.dumps(d)


def _check_old_reading(d: dict, tree: Tree) -> None:
    from sera_jax.rl.rewards import env_success, execution_reward

    for nid, node in d["nodes"].items():
        new = tree.nodes[nid]
        assert env_success(new) == _old_env_success(node), nid
        for mode in ("rao", "rubric"):
            assert execution_reward(new, is_root=False, mode=mode) == _old_execution_reward(node, mode), (nid, mode)


def test_records_written_before_reward_load_and_read_as_they_did():
    tree = _full_tree()
    tree.nodes["r"].turns[0].reward_misc = {"reward/success": 1.0}               # the checker's verdict
    tree.nodes["c1"].turns[0].reward_misc = {"reward/code_success": 1.0, "reward/success": 0.7,
                                             "reward/rubric_score": 0.7, "reward/filter_success": 1.0}
    tree.nodes["c1"].rollout_error_zero_reward = False
    judged = Node(id="c2", goal="g", depth=1, parent_id="r", fork_step=1, env_labels={"success": 0.0,
                  "judge_success": 1.0}, turns=[_turn(0, reward_misc={"reward/success": 0.0})])
    bare = Node(id="c3", goal="g", depth=1, parent_id="r", fork_step=1)       # never finished: reward null
    only_float = Node(id="c4", goal="g", depth=1, parent_id="r", fork_step=1)  # no labels at all: the float
    tree.nodes.update({"c2": judged, "c3": bare, "c4": only_float})
    line = _old_line(tree, {"r": 1.0, "c1": 0.7, "c2": 0.0, "c3": None, "c4": 1.0})
    back = loads_tree(line)
    assert back.nodes["r"].reward == Reward(environment=1.0)
    assert back.nodes["c1"].reward == Reward(environment=1.0, rubric_score=0.7)   # code_success: the env value
    assert back.nodes["c2"].reward == Reward(environment=0.0, judge=1.0)
    assert back.nodes["c3"].reward == Reward() and back.nodes["c4"].reward == Reward(environment=1.0)
    _check_old_reading(json.loads(line), back)
    # Written again, the typed reward is what is stored, and it reads back the same.
    assert loads_tree(dumps_tree(back)) == back


def test_tree_files_in_the_repository_read_as_they_did():
    """Every tree file kept in docs/ or tests/ (written before ``Reward``) gives each node the rewards it gave."""
    root = Path(__file__).resolve().parents[2]
    files = [p for d in ("docs", "tests") for p in (root / d).rglob("*.jsonl*") if p.suffix in (".jsonl", ".gz")]
    for path in files:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as fh:
            for line in fh:
                d = json.loads(line)
                if "nodes" not in d or "root_id" not in d:
                    break  # not a tree file (metrics, summaries)
                _check_old_reading(d, loads_tree(line))
