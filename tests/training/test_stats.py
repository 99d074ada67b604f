"""Step metrics from tree records: ranking AUC/accuracy over fork groups, supervision counts and judge tokens,
tree shape."""

import pytest

from sera_jax.agents.records import Branch, ForkGroup, Node, RubricScore, Tree
from sera_jax.training.stats import ranking_auc, tree_metrics


def test_ranking_auc_vectors():
    assert ranking_auc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert ranking_auc([0.1, 0.9], [True, False]) == 0.0
    assert ranking_auc([0.5, 0.5], [True, False]) == 0.5
    assert ranking_auc([0.5, 0.7], [True, True]) is None


def _tree(success, scores, labels):
    root = Node(id="root", goal="g", depth=0, parent_id=None, fork_step=None, env_labels={"success": success})
    # Two labelled branch nodes as the counterfactual collector records them: one label took a retry without usage.
    spent = [{"success": True, "calls": 1, "prompt_tokens": 300, "completion_tokens": 20, "unmetered_calls": 0},
             {"success": False, "calls": 2, "prompt_tokens": 310, "completion_tokens": 25, "unmetered_calls": 1}]
    kids = {f"b{i}": Node(id=f"b{i}", goal="c", depth=1, parent_id="root", misc={"judge_label": j})
            for i, j in enumerate(spent)}
    branches = [Branch(branch_index=i, trajectory_id=f"b{i}", depth=1, success=y, score=s)
                for i, (s, y) in enumerate(zip(scores, labels))]
    group = ForkGroup(id="fg", parent_id="root", fork_step=0, child_depth=1, branches=branches)
    return Tree(id="t", task_id="task", root_id="root", nodes={"root": root, **kids}, fork_groups=[group],
                misc={"stats": {"nodes": 9, "delegations": 1, "max_depth": 1, "completion_tokens": 100,
                                "agent_errors": 2},
                      "rubric_stats": {"groups": 1, "complete": 1, "rubric_invalid": 0, "scores": 7,
                                       "score_invalid": 1}})


def test_tree_metrics():
    labels = [True, True, False, False, True, False, False, True]
    scores = [0.9, 0.8, 0.2, 0.85, 0.7, 0.1, None, 0.6]
    m = tree_metrics([_tree(1.0, scores, labels), _tree(0.0, scores, labels)], env="textworld_sync")
    assert m["root_success"] == 0.5 and m["delegation_rate"] == 1.0
    # supervision spent, summed over both trees' records
    assert m["supervision/judge_labels"] == 16 and m["supervision/programmatic_labels"] == 0
    assert m["supervision/judge_calls"] == 6 and m["supervision/judge_unmetered_calls"] == 2
    assert m["supervision/judge_prompt_tokens"] == 1220 and m["supervision/judge_completion_tokens"] == 90
    tc = tree_metrics([_tree(1.0, scores, labels)], env="textcraft")
    assert tc["supervision/programmatic_labels"] == 8 and tc["supervision/judge_labels"] == 0
    # scored pairs: successes {.9,.8,.7,.6} × failures {.2,.85,.1}: only .9 beats .85, so 3+2+2+2 = 9 of 12
    assert m["rubric_ranking_accuracy"] == pytest.approx(9 / 12) and m["rubric_ranking_auc"] == pytest.approx(9 / 12)
    assert m["score_calls"] == 16 and m["score_invalid"] == 2 and m["agent_errors"] == 4
    assert m["rubric_calls"] == 2 and m["rubric_invalid"] == 0
    assert tree_metrics([]) == {}


def test_execution_stage_rubric_counts():
    """The execution stage's coordinator records children/scored/score_invalid: one rubric call per child, one
    scoring call per valid rubric (these once read as zero rubric calls)."""
    root = Node(id="root", goal="g", env_labels={"success": 1.0})
    t = Tree(id="t", task_id="task", root_id="root", nodes={"root": root},
             misc={"rubric_stats": {"children": 5, "rubric_invalid": 2, "score_invalid": 1, "scored": 2}})
    m = tree_metrics([t, t])
    assert m["rubric_calls"] == 10 and m["rubric_invalid"] == 4
    assert m["score_calls"] == 6 and m["score_invalid"] == 2


def test_execution_stage_scored_subagents_against_their_success():
    """At execution steps the policy scores its children with its rubrics: the step reports how those scores rank
    the children's programmatic successes and how often the score's success flag equals the real one. Fork-branch
    nodes (rubric-generation stage) and unscored children are left out."""
    def child(i, score, flag, success, **kw):
        return Node(id=f"c{i}", goal="c", depth=1, parent_id="root", env_labels={"success": success},
                    rubric_score=None if score is None else RubricScore(score, flag, success), **kw)

    root = Node(id="root", goal="g", env_labels={"success": 1.0})
    kids = [child(0, 0.9, True, 1.0), child(1, 0.2, False, 0.0), child(2, 0.7, True, 0.0),   # c2: flag wrong
            child(3, 0.95, True, 1.0), child(4, None, False, 0.0),                            # c4: not scored
            child(5, 0.0, False, 1.0, fork_group_id="fg", branch_index=0)]                     # a fork branch
    t = Tree(id="t", task_id="task", root_id="root", nodes={"root": root, **{k.id: k for k in kids}})
    m = tree_metrics([t])
    assert m["scored_subagents"] == 4 and m["subagent_score_agreement"] == pytest.approx(3 / 4)
    # successes {.9, .95} × failures {.2, .7}: every pair ordered
    assert m["subagent_score_accuracy"] == 1.0 and m["subagent_score_auc"] == 1.0
    kids[2].rubric_score = RubricScore(0.92, True, 0.0)   # a failure scored above one success: 3 of 4 pairs
    m = tree_metrics([t])
    assert m["subagent_score_accuracy"] == pytest.approx(3 / 4) and m["subagent_score_auc"] == pytest.approx(3 / 4)
    only_successes = Tree(id="u", task_id="task", root_id="root", nodes={"root": root, "c0": kids[0]})
    m = tree_metrics([only_successes])
    assert m["subagent_score_agreement"] == 1.0 and "subagent_score_auc" not in m
    assert "scored_subagents" not in tree_metrics([Tree(id="v", task_id="task", root_id="root",
                                                        nodes={"root": root})])


def test_execution_judge_spend_is_counted():
    """TextWorld RAO execution labels (agents.subagent_judge): every request counts in the judge totals and in its
    own execution_judge_* share; a failed label counts its requests but no label."""
    root = Node(id="root", goal="g", env_labels={"success": 0.0})
    ok = {"success": True, "reason": "r", "error": "", "calls": 1, "prompt_tokens": 500, "completion_tokens": 9,
          "unmetered_calls": 0}
    failed = {"success": None, "reason": "", "error": "HTTP 500", "calls": 1, "prompt_tokens": 0,
              "completion_tokens": 0, "unmetered_calls": 1}
    kids = {"a": Node(id="a", goal="x", depth=1, parent_id="root", env_labels={"judge_success": 1.0},
                      misc={"execution_judge": ok}),
            "b": Node(id="b", goal="y", depth=1, parent_id="root", skip_gradient_update=True,
                      misc={"execution_judge": failed})}
    t = Tree(id="t", task_id="task", root_id="root", nodes={"root": root, **kids})
    m = tree_metrics([t, t], env="textworld_sync")
    assert m["supervision/judge_calls"] == 4 and m["supervision/execution_judge_calls"] == 4
    assert m["supervision/judge_labels"] == 2 and m["supervision/execution_judge_labels"] == 2
    assert m["supervision/execution_judge_failures"] == 2
    assert m["supervision/judge_prompt_tokens"] == 1000 == m["supervision/execution_judge_prompt_tokens"]
    assert m["supervision/execution_judge_completion_tokens"] == 18
    assert m["supervision/judge_unmetered_calls"] == 2 == m["supervision/execution_judge_unmetered_calls"]
    plain = tree_metrics([Tree(id="u", task_id="task", root_id="root", nodes={"root": root})])
    assert plain["supervision/execution_judge_calls"] == 0 and plain["supervision/judge_labels"] == 0
