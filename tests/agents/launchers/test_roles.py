"""Side-call roles on scripted trees (agents/roles.py): a fixed rubric file (no writer call), another generator as
the writer or scorer (an endpoint's retries, garbage, an unreachable server), per-role spend, what may be trained,
and the oracle selector of best-of-N."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.judge import Label
from sera_jax.agents.launchers.best_of_n import BestOfNSelector, choose_first_success
from sera_jax.agents.launchers.counterfactual import rank_fork_groups
from sera_jax.agents.launchers.rubric import RubricCoordinator
from sera_jax.agents.records import Turn
from sera_jax.agents.roles import SPEND_KEY, RoleCaller, RoleCallers, global_rubric
from sera_jax.agents.rubric_calls import RubricConfig
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.datums import execution_datums, policy_tokens, rubric_datums
from sera_jax.training.stats import tree_metrics
from tests.agents.rubric_scripts import TC_CHILD, TC_CHILD_OK, TC_ROOT, TW_CHILD, TW_CHILD_REPLIES, TW_ROOT, \
    rubric_text, score_text


class Named(ScriptedGenerator):
    """A scripted generator that logs the call names it answered (who played which call)."""

    def __init__(self, tok, script, fail=()):
        super().__init__(tok, script)
        self.names, self.fail = [], tuple(fail)

    async def generate(self, prompt_ids, params, key=None):
        name = CURRENT_TURN.get().node_id
        self.names.append(name)
        if name.startswith(self.fail):
            raise ConnectionError("cannot reach http://127.0.0.1:9/v1/chat/completions")
        return await super().generate(prompt_ids, params, key)


def _run(task, env, tok, policy_script, roles):
    policy = Named(tok, policy_script)
    launcher = RubricCoordinator(env, RubricConfig(), roles)

    async def main():
        tree = await run_tree(task, env, policy, tok, RuntimeSettings.for_env(env), launcher=launcher)
        await launcher.finalize(tree)
        return tree

    return asyncio.run(main()), policy


def test_file_writer_makes_no_call_and_the_policy_scores(tc_task, tok):
    rubric = global_rubric("textcraft")
    roles = RoleCallers(rubric_writer=RoleCaller("rubric_writer", "file", rubric=rubric))
    script = {"root": TC_ROOT, TC_CHILD: TC_CHILD_OK, f"score:{TC_CHILD}": [score_text(0.7, True)]}
    tree, policy = _run(tc_task, "textcraft", tok, script, roles)
    assert not any(n.startswith("rubric:") for n in policy.names)  # no rubric call at all
    child = tree.nodes[TC_CHILD]
    assert child.reward.rubric_score == 0.7 and child.rubric_score.rubric == rubric
    spend = tree.misc[SPEND_KEY]
    assert "rubric_writer/file" not in spend and spend["scorer/policy"]["calls"] == 1
    assert tree.misc["rubric_stats"]["rubric_writer"] == "file"
    m = tree_metrics([tree], env="textcraft")
    assert m["roles/rubric_writer/file/calls"] == 0.0 and m["roles/scorer/policy/calls"] == 1.0
    assert m["rubric_calls"] == 0.0 and m["score_calls"] == 1.0
    assert m["roles/actor/policy/calls"] == sum(len(n.turns) for n in tree.nodes.values())


def test_endpoint_writer_retries_garbage_and_scorer_spend(tc_task, tok):
    """An endpoint writer retries an invalid reply (the reference's external client does); the writer's turns are
    tagged with its backend and never trained; another generator scores."""
    ext = Named(tok, {f"rubric:{TC_CHILD}": ["not json at all"], f"rubric:{TC_CHILD}@2": [rubric_text(2, 1)],
                      f"score:{TC_CHILD}": [score_text(0.9, True)]})
    roles = RoleCallers(rubric_writer=RoleCaller("rubric_writer", "endpoint", generator=ext, tokenizer=tok,
                                                 max_attempts=3, backoff_s=0.0),
                        scorer=RoleCaller("scorer", "endpoint", generator=ext, tokenizer=tok, max_attempts=3,
                                          backoff_s=0.0))
    script = {"root": TC_ROOT, TC_CHILD: TC_CHILD_OK}
    tree, policy = _run(tc_task, "textcraft", tok, script, roles)
    assert not any(n.startswith(("rubric:", "score:")) for n in policy.names)
    assert ext.names.count(f"rubric:{TC_CHILD}") == 1 and f"rubric:{TC_CHILD}@2" in ext.names
    child = tree.nodes[TC_CHILD]
    assert child.reward.rubric_score == 0.9 and not child.skip_gradient_update
    spend = tree.misc[SPEND_KEY]
    assert spend["rubric_writer/endpoint"]["calls"] == 2 and spend["rubric_writer/endpoint"]["failures"] == 1
    assert spend["scorer/endpoint"] == {"calls": 1, "failures": 0, "prompt_tokens": spend["scorer/endpoint"][
        "prompt_tokens"], "completion_tokens": spend["scorer/endpoint"]["completion_tokens"]}
    assert spend["scorer/endpoint"]["prompt_tokens"] > 0 and spend["scorer/endpoint"]["completion_tokens"] > 0
    m = tree_metrics([tree], env="textcraft")
    assert m["roles/rubric_writer/endpoint/calls"] == 2.0 and m["roles/rubric_writer/endpoint/failures"] == 1.0
    assert m["roles/scorer/endpoint/calls"] == 1.0 and "roles/scorer/policy/calls" not in m
    # Only the policy's tokens train: execution datums are the agents' turns; no side call is among them.
    ids = {d.node_id for d in execution_datums(tree, mode="rubric")}
    assert ids == {"root", TC_CHILD}


@pytest.mark.parametrize("fault", ["unreachable", "garbage"])
def test_a_faulty_external_writer_or_scorer_is_counted_and_the_tree_kept(tw_task, tok, fault):
    """Unreachable (every attempt raises) or garbage (every reply invalid): the sub-agent is untrainable and counted,
    the parent was answered as usual, the tree keeps every node."""
    for role in ("rubric_writer", "scorer"):
        replies = {f"{k}:{TW_CHILD}{a}": ["garbage"] for k in ("rubric", "score") for a in ("", "@2")}
        if role == "scorer":
            replies.update({f"rubric:{TW_CHILD}": [rubric_text()]})
        ext = Named(tok, replies, fail=("rubric:",) if fault == "unreachable" and role == "rubric_writer" else
                    ("score:",) if fault == "unreachable" else ())
        caller = RoleCaller(role, "endpoint", generator=ext, tokenizer=tok, max_attempts=2, backoff_s=0.0)
        roles = RoleCallers(**{role: caller})
        script = {"root": TW_ROOT, TW_CHILD: TW_CHILD_REPLIES, f"rubric:{TW_CHILD}": [rubric_text()],
                  f"score:{TW_CHILD}": [score_text(0.5)]}
        tree, _ = _run(tw_task, "textworld_sync", tok, script, roles)
        child = tree.nodes[TW_CHILD]
        assert set(tree.nodes) == {"root", TW_CHILD} and len(child.turns) == 2
        assert child.skip_gradient_update and child.rubric_score is None
        which = "rubric" if role == "rubric_writer" else "score"
        assert child.misc["rubric_failure"].startswith(f"invalid {which}: endpoint {role}, attempt 2/2")
        stats = tree.misc["rubric_stats"]
        assert stats[f"{which}_invalid"] == 1 and stats[role] == "endpoint"
        spend = tree.misc[SPEND_KEY][f"{role}/endpoint"]
        assert spend["calls"] == 2 and spend["failures"] == 2
        assert tree.root.turns[0].output.startswith("[SubAgent Results]")
        assert {d.node_id for d in execution_datums(tree, filter_errors=False)} == {"root"}


def test_rubric_datums_only_from_the_policys_turns(tc_task, tok):
    """A fork group whose rubric turn another backend wrote (or whose logprobs are unknown) gives no datum."""
    from sera_jax.agents.records import Branch, ForkGroup, Tree

    def group(turn):
        g = ForkGroup(id="g", parent_id="root", fork_step=0, child_depth=1, goal="x", num_branches=2)
        g.branches = [Branch(branch_index=b, trajectory_id=f"c#b{b}", depth=1, reward=float(b), success=bool(b),
                             score=0.2 + 0.6 * b) for b in range(2)]
        g.rubric, g.rubric_turn = {"rubric_items": []}, turn
        return g

    def turn(backend=None, lp=-0.5):
        t = Turn(index=0, prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[lp, lp], policy_version=0)
        if backend:
            t.misc["backend"] = backend
        return t

    trees = []
    for t in (turn(), turn("policy"), turn("endpoint"), turn("frozen"), turn(lp=float("nan"))):
        tree = Tree(id=f"t{len(trees)}", task_id="task", root_id="root")
        tree.fork_groups = [group(t)]
        trees.append(tree)
    assert [policy_tokens(tr.fork_groups[0].rubric_turn) for tr in trees] == [True, True, False, False, False]
    assert len([d for d in rubric_datums(trees) if d.trainable]) == 2


def test_rubric_stage_with_an_external_scorer(tc_task, tok):
    """The rubric-generation stage's fresh rubric is the policy's (its datum); the branch scores another's."""
    from types import SimpleNamespace

    from sera_jax.agents.records import Branch, ForkGroup, Node, Tree

    tree = Tree(id="t", task_id="task", root_id="root")
    tree.nodes = {"root": Node(id="root", goal="make a", depth=0),
                  **{f"c#b{b}": Node(id=f"c#b{b}", goal="make b", depth=1, parent_id="root") for b in range(2)}}
    g = ForkGroup(id="g", parent_id="root", fork_step=0, child_depth=1, goal="make b", num_branches=2)
    g.branches = [Branch(branch_index=b, trajectory_id=f"c#b{b}", depth=1, reward=float(b), success=bool(b),
                         initial_state={"inventory": {}}, final_state={"inventory": {}}) for b in range(2)]
    tree.fork_groups = [g]
    tree.misc["fork_group_inputs"] = {"g": {"messages": [], "action": "launch", "budget": 20}}
    policy = Named(tok, {"rubric:g": [rubric_text()]})
    ext = Named(tok, {"score:g#b0": [score_text(0.0, False)], "score:g#b1": [score_text(0.8, True)]})
    import jax
    run = SimpleNamespace(tree=tree, generator=policy, tokenizer=tok, root_key=jax.random.key(0),
                          settings=RuntimeSettings.for_env("textcraft"))
    roles = RoleCallers(scorer=RoleCaller("scorer", "endpoint", generator=ext, tokenizer=tok))
    stats = asyncio.run(rank_fork_groups(tree, run, RubricConfig(), roles=roles))
    assert stats["scores"] == 2 and policy.names == ["rubric:g"] and sorted(ext.names) == ["score:g#b0", "score:g#b1"]
    assert g.rubric_turn.misc["backend"] == "policy" and all(t.misc["backend"] == "endpoint" for t in g.score_turns)
    assert [d.reward for d in rubric_datums([tree]) if d.trainable] != []
    assert tree.misc[SPEND_KEY]["rubric_writer/policy"]["calls"] == 1
    assert tree.misc[SPEND_KEY]["scorer/endpoint"]["calls"] == 2


def test_choose_first_success():
    assert choose_first_success([False, True, True]) == 1
    assert choose_first_success([None, False]) == 0
    assert choose_first_success([]) == 0


class ScriptedJudge:
    backend = "endpoint"

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    async def label(self, node, parent_goal=""):
        self.asked.append(node.id)
        ok = self.answers.get(node.id.rsplit("#c", 1)[1])
        return Label(ok, "r", 1, "" if ok is not None else "no reply", prompt_tokens=10, completion_tokens=2)


@pytest.mark.parametrize("answers, chosen, asked", [({"0": False, "1": True, "2": True}, 1, 2),
                                                     ({"0": None, "1": False, "2": False}, 0, 3)])
def test_oracle_selector_takes_the_first_success(tw_task, tok, answers, chosen, asked):
    judge = ScriptedJudge(answers)
    sel = BestOfNSelector("textworld_sync", n=3, roles=RoleCallers(selector_judge=judge))
    kids = [f"{TW_CHILD}#c{i}" for i in range(3)]
    script = {"root": TW_ROOT, **{k: TW_CHILD_REPLIES for k in kids}}
    policy = Named(tok, script)

    async def main():
        return await run_tree(tw_task, "textworld_sync", policy, tok, RuntimeSettings.for_env("textworld_sync"),
                              launcher=sel)

    tree = asyncio.run(main())
    assert not any(n.startswith(("rubric:", "score:")) for n in policy.names)  # the oracle writes no rubric
    record = tree.delegations[0].misc["selection"][0]
    assert record["mode"] == "oracle" and record["selected"] == chosen and len(judge.asked) == asked
    assert tree.nodes[kids[chosen]].misc["selection"]["selected"]
    spend = tree.misc[SPEND_KEY]["selector/endpoint"]
    assert spend["calls"] == asked and spend["prompt_tokens"] == 10 * asked
    assert spend["failures"] == sum(1 for k in list(answers)[:asked] if answers[k] is None)


def test_a_gathered_tree_keeps_its_actor_spend(tc_task, tok):
    """A multi-host step gathers trees without their turns: the actor's spend survives as a summary."""
    from sera_jax.agents.records import tree_from_dict
    from sera_jax.training.shared_step import light_tree

    script = {"root": TC_ROOT, TC_CHILD: TC_CHILD_OK, f"rubric:{TC_CHILD}": [rubric_text()],
              f"score:{TC_CHILD}": [score_text(0.5)]}
    tree, _ = _run(tc_task, "textcraft", tok, script, None)
    light = tree_from_dict(light_tree(tree))
    assert all(not n.turns for n in light.nodes.values())
    full, gathered = tree_metrics([tree], env="textcraft"), tree_metrics([light], env="textcraft")
    roles = {k: v for k, v in full.items() if k.startswith("roles/")}
    assert roles["roles/actor/policy/calls"] > 0 and {k: gathered[k] for k in roles} == roles
