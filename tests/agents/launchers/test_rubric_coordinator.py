"""The execution-stage rubric coordinator on scripted trees: rubric before the child, frozen-rubric score after,
the score replacing the sub-agent's reward, every malformed rubric and score under every failure policy, and
neither parent nor child ever seeing rubric or score."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.launchers.rubric import RubricCoordinator, usable_trees
from sera_jax.agents.rubric_calls import RubricConfig
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.datums import execution_datums
from tests.agents.rubric_scripts import (
    BAD_RUBRICS,
    BAD_SCORES,
    TC_CHILD,
    TC_CHILD_OK,
    TC_ROOT,
    TW_CHILD,
    TW_CHILD_REPLIES,
    TW_ROOT,
    rubric_text,
    score_text,
)


class Logged:
    """Passes calls to a generator, logging (name, start, end); score calls are slowed so that the parent's
    next turn demonstrably does not wait for them."""

    def __init__(self, inner, score_delay=0.0):
        self.inner, self.score_delay, self.log = inner, score_delay, []

    async def generate(self, prompt_ids, params, key=None):
        info = CURRENT_TURN.get()
        name = f"{info.node_id}@{info.turn}"
        t0 = asyncio.get_running_loop().time()
        if name.startswith("score:"):
            await asyncio.sleep(self.score_delay)
        r = await self.inner.generate(prompt_ids, params, key)
        self.log.append((name, t0, asyncio.get_running_loop().time(), params))
        return r


def _run(task, env, tok, script, policy="drop_trajectory", score_delay=0.0):
    gen = Logged(ScriptedGenerator(tok, script), score_delay)
    launcher = RubricCoordinator(env, RubricConfig(failure_policy=policy))

    async def main():
        tree = await run_tree(task, env, gen, tok, RuntimeSettings.for_env(env), launcher=launcher)
        await launcher.finalize(tree)
        return tree

    return asyncio.run(main()), gen


def _no_rubric_in_agent_prompts(tree, tok):
    for node in tree.nodes.values():
        for t in node.turns:
            text = tok.decode(t.prompt_ids)
            assert "RUBRICMARK" not in text and "frozen rubric" not in text and "final_score" not in text


def test_valid_rubric_and_score_textcraft(tc_task, tok, monkeypatch):
    import sera_jax.agents.rubric_calls as rubric_calls

    requested = {}  # when each side call was asked for (its prompt is then built on a thread, as a turn's is)
    inner_call = rubric_calls.policy_call

    async def logged_call(*args, name="", **kw):
        requested.setdefault(name, asyncio.get_running_loop().time())
        return await inner_call(*args, name=name, **kw)

    monkeypatch.setattr(rubric_calls, "policy_call", logged_call)
    script = {"root": TC_ROOT, TC_CHILD: TC_CHILD_OK, f"rubric:{TC_CHILD}": [rubric_text(2, 1, 1)],
              f"score:{TC_CHILD}": ['```json\n' + score_text(0.8, True) + '\n```']}
    tree, gen = _run(tc_task, "textcraft", tok, script, score_delay=0.5)
    child = tree.nodes[TC_CHILD]
    assert child.env_labels["success"] == 1.0 and child.reward.rubric_score == 0.8
    rs = child.rubric_score
    assert (rs.score, rs.success, rs.original_binary_reward) == (0.8, True, 1.0)
    assert [i["weight"] for i in rs.rubric["rubric_items"]] == [0.5, 0.25, 0.25]
    assert child.reward.environment == 1.0  # the env value at its return, kept beside the score
    assert tree.delegations[0].kind == "rubric" and tree.misc["rubric_stats"]["scored"] == 1
    # The parent's answer is the default one, and the parent went on before the (slow) score came back.
    assert tree.root.turns[1].output.startswith("made\n\nBudget used by subagent: 1/20 steps.")
    times = {name: (t0, t1) for name, t0, t1, _ in gen.log}
    assert times["root@2"][0] < times[f"score:{TC_CHILD}@0"][1]
    # The rubric was asked for before the child's first turn was (which of the two prompts, each built on a worker
    # thread, reaches the generator first is the threads' race); sampling per docs/design/algorithm.md §3.5.
    assert requested[f"rubric:{TC_CHILD}"] <= times[f"{TC_CHILD}@0"][0]
    params = {name: p for name, _, _, p in gen.log}
    assert params[f"rubric:{TC_CHILD}@0"].temperature == 1.0 and params[f"rubric:{TC_CHILD}@0"].max_new_tokens == 1024
    assert params[f"score:{TC_CHILD}@0"].temperature == 0.0
    _no_rubric_in_agent_prompts(tree, tok)
    assert child.misc["rubric"]["rubric_call"]["prompt_tokens"] > 0 and child.misc["rubric"]["score_error"] == ""
    # The sub-agent's execution datums carry the score.
    ds = {d.node_id: d.reward for d in execution_datums(tree, mode="rubric")}
    assert ds == {"root": tree.root.env_labels["success"], TC_CHILD: 0.8}


def test_rubric_inputs_textworld(tw_task, tok):
    seen = {}

    def script(info, ids):
        name = info.node_id
        if name.startswith(("rubric:", "score:")):
            seen[name.split(":")[0]] = tok.decode(ids)
            return rubric_text() if name.startswith("rubric:") else score_text(0.5)
        replies = {"root": TW_ROOT, TW_CHILD: TW_CHILD_REPLIES}[name]
        return replies[info.turn]

    tree, _ = _run(tw_task, "textworld_sync", tok, script)
    r = seen["rubric"]
    assert "Generate a scoring rubric for the delegated SubAgent task." in r
    assert "[Delegated SubAgent Task]\ntake the white onion" in r and '"fork_step": 0' in r
    assert '<delegate>{"goal": "take the white onion"}</delegate>' in r and "[Parent Message 1: user]" in r
    assert "dishes" in r  # the observable world state before the call
    s = seen["score"]
    assert "Score this completed SubAgent trajectory using the frozen rubric." in s and "take white onion" in s
    assert tree.nodes[TW_CHILD].reward.rubric_score == 0.5 and tree.nodes[TW_CHILD].rubric_score.success
    _no_rubric_in_agent_prompts(tree, tok)


CASES = [("rubric", k, v) for k, v in BAD_RUBRICS.items()] + [("score", k, v) for k, v in BAD_SCORES.items()]


@pytest.mark.parametrize("policy", ["drop_trajectory", "skip_rollout", "fallback_binary"])
@pytest.mark.parametrize("which, case, text", CASES, ids=[f"{w}-{c}" for w, c, _ in CASES])
def test_malformed_rubric_or_score(tw_task, tok, policy, which, case, text):
    script = {"root": TW_ROOT, TW_CHILD: TW_CHILD_REPLIES,
              f"rubric:{TW_CHILD}": [text if which == "rubric" else rubric_text()],
              f"score:{TW_CHILD}": [text if which == "score" else score_text(0.9)]}
    tree, gen = _run(tw_task, "textworld_sync", tok, script, policy)
    child = tree.nodes[TW_CHILD]
    assert child.misc["rubric_failure"].startswith(f"invalid {which}")
    # An invalid rubric means no scoring call at all (nothing to score against).
    assert any(n.startswith("score:") for n, *_ in gen.log) == (which == "score")
    assert tree.root.turns[0].output.startswith("[SubAgent Results]")  # the parent was answered as usual
    env = child.env_labels["success"]
    if policy == "fallback_binary":
        assert not child.skip_gradient_update and child.rubric_score.score == env
        assert child.rubric_score.score_payload["fallback_binary"] == child.misc["rubric_failure"]
        assert {d.node_id for d in execution_datums(tree, filter_errors=False)} == {"root", TW_CHILD}
    else:
        assert child.skip_gradient_update and child.rubric_score is None
        assert {d.node_id for d in execution_datums(tree, filter_errors=False)} == {"root"}
        assert usable_trees([tree]) == ([] if policy == "skip_rollout" else [tree])
    # The env value stays; the fallback policy grades with it, the others leave the node ungraded by a rubric.
    assert child.reward.environment == env
    assert child.reward.rubric_score == (env if policy == "fallback_binary" else None)


def test_two_children_in_lockstep_and_a_failing_rubric_call(tw_task, tok):
    """A delegate block with two goals in deterministic mode: each child gets its own rubric and score; a generator
    error on one rubric call is an invalid rubric for that child only (the policy client makes one attempt)."""
    two = '<delegate>{"delegations": [{"goal": "take the white onion"}, {"goal": "look around"}]}</delegate>'
    kids = ["root/subagent-0-0", "root/subagent-0-1"]

    class Failing(ScriptedGenerator):
        async def generate(self, prompt_ids, params, key=None):
            if CURRENT_TURN.get().node_id == f"rubric:{kids[1]}":
                raise RuntimeError("engine refused the request")
            return await super().generate(prompt_ids, params, key)

    script = {"root": [two, "<finish>done</finish>"], kids[0]: TW_CHILD_REPLIES,
              kids[1]: ["<action>look around</action>", "<finish>looked</finish>"],
              f"rubric:{kids[0]}": [rubric_text()], f"score:{kids[0]}": [score_text(0.6)]}
    launcher = RubricCoordinator("textworld_sync")

    async def main():
        s = RuntimeSettings.for_env("textworld_sync", deterministic=True)
        tree = await run_tree(tw_task, "textworld_sync", Failing(tok, script), tok, s, launcher=launcher)
        await launcher.finalize(tree)
        return tree

    tree = asyncio.run(main())
    a, b = (tree.nodes[k] for k in kids)
    assert a.rubric_score.score == 0.6 and not a.skip_gradient_update
    assert b.skip_gradient_update and "engine refused the request" in b.misc["rubric_failure"]
    assert tree.misc["rubric_stats"] == {"children": 2, "rubric_invalid": 1, "score_invalid": 0, "scored": 1}
