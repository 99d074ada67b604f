"""Test-time selection on scripted trees of both environments: the higher-scored candidate is committed, ties and
invalid rubrics fall back to the lowest index, candidates sample at temperature 1.0 under a greedy root, and the
strict fork budget of 32 answers with the spec's message."""

from __future__ import annotations

import asyncio

from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.launchers.best_of_n import EXHAUSTED_TEXT, BestOfNSelector, choose
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from tests.agents.rubric_scripts import (
    TC_CHILD,
    TC_CHILD_BAD,
    TC_CHILD_OK,
    TC_ROOT,
    TW_CHILD,
    TW_ROOT,
    py,
    rubric_text,
    score_text,
)


class Params:
    """Keeps the sampling params of every call by caller name."""

    def __init__(self, inner):
        self.inner, self.seen = inner, {}

    async def generate(self, prompt_ids, params, key=None):
        info = CURRENT_TURN.get()
        self.seen[f"{info.node_id}@{info.turn}"] = params
        return await self.inner.generate(prompt_ids, params, key)


def _run(task, env, tok, script, selector):
    gen = Params(ScriptedGenerator(tok, script))
    s = RuntimeSettings.for_env(env, evaluation=True)
    return asyncio.run(run_tree(task, env, gen, tok, s, launcher=selector)), gen


def test_choose():
    assert choose([0.2, 0.9]) == 1 and choose([0.5, 0.5]) == 0 and choose([None, None]) == 0
    assert choose([None, 0.0]) == 1 and choose([0.3, None, 0.7, 0.7]) == 2


def test_textcraft_higher_score_committed(tc_task, tok):
    script = {"root": TC_ROOT, TC_CHILD + "#c0": TC_CHILD_BAD, TC_CHILD + "#c1": TC_CHILD_OK,
              f"rubric:{TC_CHILD}": [rubric_text()], f"score:{TC_CHILD}#c0": [score_text(0.0, False)],
              f"score:{TC_CHILD}#c1": [score_text(0.9, True)]}
    tree, gen = _run(tc_task, "textcraft", tok, script, BestOfNSelector("textcraft"))
    sel = tree.delegations[0].misc["selection"][0]
    assert (sel["scores"], sel["selected"], tree.delegations[0].kind) == ([0.0, 0.9], 1, "best_of_n")
    # The chosen clone's world was committed: the crafted items are in the parent's inventory.
    assert tree.root.turns[1].output.startswith("made\n\nBudget used by subagent: 1/20 steps.")
    assert "'o3_i1': 4" in tree.root.turns[2].output
    assert tree.nodes[TC_CHILD + "#c1"].misc["selection"] == {"score": 0.9, "selected": True}
    # Root greedy, candidates at 1.0, rubric and scoring greedy with 1024 / 512 tokens.
    assert gen.seen["root@0"].temperature == 0.0 and gen.seen[f"{TC_CHILD}#c0@0"].temperature == 1.0
    rubric, score = gen.seen[f"rubric:{TC_CHILD}@0"], gen.seen[f"score:{TC_CHILD}#c1@0"]
    assert (rubric.temperature, rubric.max_new_tokens, score.temperature, score.max_new_tokens) == (0, 1024, 0, 512)


def _tw_script(rubric, s0, s1):
    return {"root": TW_ROOT, TW_CHILD + "#c0": ["<action>look around</action>", "<finish>looked</finish>"],
            TW_CHILD + "#c1": ["<action>take white onion</action>", "<finish>took it</finish>"],
            f"rubric:{TW_CHILD}": [rubric], f"score:{TW_CHILD}#c0": [s0], f"score:{TW_CHILD}#c1": [s1]}


def test_textworld_selection_tie_and_invalid(tw_task, tok):
    tree, _ = _run(tw_task, "textworld_sync", tok, _tw_script(rubric_text(), score_text(0.1), score_text(0.8)),
                   BestOfNSelector("textworld_sync"))
    assert tree.delegations[0].misc["selection"][0]["selected"] == 1
    assert "returned=True" in tree.root.turns[0].output and "took it" in tree.root.turns[0].output
    for script, scores in ((_tw_script(rubric_text(), score_text(0.5), score_text(0.5)), [0.5, 0.5]),  # tie
                           (_tw_script("no rubric", score_text(0.1), score_text(0.9)), [None, None]),
                           (_tw_script(rubric_text(), "garbage", '{"final_score": 2}'), [None, None])):
        tree, _ = _run(tw_task, "textworld_sync", tok, script, BestOfNSelector("textworld_sync"))
        sel = tree.delegations[0].misc["selection"][0]
        assert (sel["scores"], sel["selected"]) == (scores, 0)
        assert "looked" in tree.root.turns[0].output


def test_strict_fork_budget(tc_task, tok):
    launch = py("r = await launch_subagent({'o3_i1': 4})\nprint(r)")
    script = {"root": [launch, launch, py("finish('ok')")], "root/subagent-0-0#c0": TC_CHILD_OK,
              "root/subagent-0-0#c1": TC_CHILD_OK}
    selector = BestOfNSelector("textcraft")
    selector.used = 30  # room for exactly one more pair of the 32
    tree, _ = _run(tc_task, "textcraft", tok, script, selector)
    assert selector.used == 32 and tree.delegations[1].misc["selection"] == [
        {"child_id": "root/subagent-1-0", "exhausted": True}]
    assert tree.root.turns[1].output == EXHAUSTED_TEXT + "\n"
    assert not any(n.startswith("root/subagent-1-0") for n in tree.nodes)
