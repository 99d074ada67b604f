"""What the rubric writer sees of one delegation in both training stages (docs/design/recipes.md §3), driven through the launcher
factory as training uses it: the execution stage (RubricCoordinator, at the launch) and the rubric-generation stage
(CounterfactualCollector, after the tree) show the *same* parent reply — TextCraft thought + code (``</python>``
appended when the reply lacks it), TextWorld the whole raw reply (free text and the delegate block); the child tools
string is the environment's own in the execution stage and always TextCraft's in the rubric-generation stage; the
child budget is 20 in TextCraft and the delegate's requested ``max_steps`` in TextWorld."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.agents.judge import ProgrammaticJudge
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.environments.textworld import CHILD_TOOLS_TEXT as TEXTWORLD_CHILD_TOOLS_TEXT
from sera_jax.agents.rubric import CHILD_TOOLS_TEXT, dumps
from sera_jax.agents.rubric_calls import child_tools
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.stages import method_config
from tests.agents.rubric_scripts import py, rubric_text, score_text

SERA = method_config("SERA")
STAGES = ("execution", "rubric_generation")

TC_LAUNCH = ("<thought>The intermediate o3_i1 is separate work: THOUGHTMARK, hand it over.</thought>\n"
             "<python>r = await launch_subagent({'o3_i1': 4})\nprint(r)</python>")
TC_CHILD = [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made')")]
TW_LAUNCH = ("Two dishes need the onion first, so a helper takes it. FREETEXTMARK\n"
             '<delegate>{"goal": "take the white onion", "max_steps": 30}</delegate>')
TW_CHILD = ["<action>take white onion</action>", "<finish>took it</finish>"]

HIDDEN = "The observation of this action is hidden: it happens only after the sub-agent returns.\n"


def between(text: str, start: str, end: str) -> str:
    """Returns the part of ``text`` after the first ``start`` and before the next ``end``."""
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def rubric_inputs(prompt: str) -> dict[str, str]:
    """Returns the parent action, child tools and child budget sections of a decoded rubric-writer prompt."""
    return {"action": between(prompt, "[Parent Step: Delegation Decision]\n" + HIDDEN,
                              "\n\n[Observable Pre-call Environment]"),
            "tools": between(prompt, "[Child Tools]\n", "\n\n[Child Execution Budget]"),
            "budget": between(prompt, "[Child Execution Budget]\n", "\n\n")}


def _rubric_prompts(task, env, tok, stage, root, child):
    """Runs one tree of ``task`` in ``stage`` (paper settings) with the root scripted to delegate once; returns the
    decoded prompts of its rubric-writer calls and the tree."""
    prompts = []

    def script(info, ids):
        name = info.node_id
        if name.startswith("rubric:"):
            prompts.append(tok.decode(ids))
            return rubric_text()
        if name.startswith("score:"):
            return score_text(0.5)
        return (root if name == "root" else child)[info.turn]  # the child, or each of its branches

    settings = RuntimeSettings.for_env(env)
    factory = make_launcher_factory(stage, SERA, env, judge=ProgrammaticJudge(), settings=settings)

    async def main():
        tree = await run_tree(task, env, ScriptedGenerator(tok, script), tok, settings, launcher=factory(task, 0))
        return (await factory.finalize([tree]))[0]

    tree = asyncio.run(main())
    return prompts, tree


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "stop-string-missing"])
def test_textcraft_both_stages_show_thought_and_code(tc_task, tok, closed):
    reply = TC_LAUNCH if closed else TC_LAUNCH.removesuffix("</python>")
    seen = {}
    for stage in STAGES:
        prompts, tree = _rubric_prompts(tc_task, "textcraft", tok, stage, [reply, py("finish('ok')")], TC_CHILD)
        assert len(prompts) == 1 and tree.delegations[0].kind == {"execution": "rubric",
                                                                  "rubric_generation": "counterfactual"}[stage]
        seen[stage] = rubric_inputs(prompts[0])
    # One text in both stages: the whole reply, thought included, closed by </python> even when the model stopped
    # without it (the code cell alone would lose the parent's reasoning).
    assert seen["execution"]["action"] == seen["rubric_generation"]["action"] == TC_LAUNCH
    assert "THOUGHTMARK" in seen["execution"]["action"]
    assert seen["execution"]["tools"] == seen["rubric_generation"]["tools"] == dumps(CHILD_TOOLS_TEXT)
    assert seen["execution"]["budget"] == seen["rubric_generation"]["budget"] == "20"


def test_textworld_both_stages_show_the_whole_reply(tw_task, tok):
    seen, trees = {}, {}
    for stage in STAGES:
        prompts, trees[stage] = _rubric_prompts(tw_task, "textworld_sync", tok, stage,
                                                [TW_LAUNCH, "<finish>done</finish>"], TW_CHILD)
        assert len(prompts) == 1
        seen[stage] = rubric_inputs(prompts[0])
    assert seen["execution"]["action"] == seen["rubric_generation"]["action"] == TW_LAUNCH
    # Tools: the TextWorld string at the launch, the TextCraft list in the ranking stage (the reference's quirk).
    assert seen["execution"]["tools"] == dumps(TEXTWORLD_CHILD_TOOLS_TEXT)
    assert seen["rubric_generation"]["tools"] == dumps(CHILD_TOOLS_TEXT)
    # Budget: the delegate asked for 30 turns; the child runs under the 20-turn cap, the rubric writer sees 30.
    assert seen["execution"]["budget"] == seen["rubric_generation"]["budget"] == "30"
    assert trees["execution"].nodes["root/subagent-0-0"].max_steps == 20
    branch0 = trees["rubric_generation"].fork_groups[0].branches[0].trajectory_id
    assert trees["rubric_generation"].nodes[branch0].max_steps == 20


def test_textworld_budget_defaults_to_twenty(tw_task, tok):
    reply = '<delegate>{"goal": "take the white onion"}</delegate>'
    prompts, _ = _rubric_prompts(tw_task, "textworld_sync", tok, "execution", [reply, "<finish>done</finish>"],
                                 TW_CHILD)
    assert rubric_inputs(prompts[0])["budget"] == "20" and rubric_inputs(prompts[0])["action"] == reply


def test_child_tools_per_stage_and_environment():
    assert child_tools("textcraft", "execution") == child_tools("textcraft", "rubric_generation") == CHILD_TOOLS_TEXT
    assert child_tools("textworld_sync", "execution") == TEXTWORLD_CHILD_TOOLS_TEXT
    assert child_tools("textworld_sync", "evaluation") == TEXTWORLD_CHILD_TOOLS_TEXT  # test-time selection
    assert child_tools("textworld_sync", "rubric_generation") == CHILD_TOOLS_TEXT
    with pytest.raises(ValueError, match="unknown rubric stage"):
        child_tools("textworld_sync", "delegation")
