"""The compact TextWorld style (the tiny CPU default): agent prompts, the scorer's and the frozen judge's requests fit a
small context whatever the policy writes, and the frozen judge's prompt budget follows the engine's context."""

from __future__ import annotations

import asyncio

from envs_py.textworld_sync import oracle_split_actions
from sera_jax.agents.judge import COMPACT_JUDGE_SYSTEM, compact_judge_messages, dish_progress
from sera_jax.agents.records import Node, Turn
from sera_jax.agents.rubric import COMPACT_TRAJECTORY_CHARS, score_request, textworld_dish_lines
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.assembly.judge import judge_settings
from sera_jax.config import load_config

CHILDREN = ["root/subagent-0-0", "root/subagent-0-1"]


def test_compact_prompts_show_observation_actions_and_task_and_offer_delegation_only_above_the_limit(tw_task, tok):
    script = {"root": ['<delegate>{"delegations": [{"goal": "eat dish_1"}, {"goal": "eat dish_2"}]}</delegate>']}
    for agent, action in oracle_split_actions(tw_task, 2):
        script.setdefault(CHILDREN[int(agent[-1])], []).append(f"<action>{action}</action>")
    gen = ScriptedGenerator(tok, script)
    s = RuntimeSettings.for_env("textworld_sync", max_depth=1, prompt_style="compact", token_history=True)
    tree = asyncio.run(run_tree(tw_task, "textworld_sync", gen, tok, s))
    assert tree.root.reward.environment == 1.0 and set(tree.nodes) == {"root", *CHILDREN}
    root_first = tok.decode(tree.root.turns[0].prompt_ids)
    assert "<delegate>" in root_first.split("<|im_start|>user")[0]  # the system message offers it at depth 0
    assert root_first.index("# Observation\nYou are in the kitchen.") < root_first.index("# Valid Actions\n") \
        < root_first.index("# Task\n" + tw_task.goal)
    child = tree.nodes[CHILDREN[0]]
    first = tok.decode(child.turns[0].prompt_ids)
    assert "<delegate>" not in first and "# Task\neat dish_1" in first and "Agent root" not in first
    later = tok.decode(child.turns[2].prompt_ids)
    assert later.startswith(tok.decode(child.turns[1].prompt_ids))  # token history: each prompt extends the last
    feedback = later.rsplit("<|im_start|>user\n", 1)[1]
    assert feedback.startswith("You are in the ") and "\n\n# Valid Actions\n" in feedback
    assert "Budget used" not in feedback and "Task Success" not in feedback


def test_compact_score_and_judge_requests_show_dish_progress_and_bounded_replies(tok):
    state = {"dishes": {"dish_1": {"ingredients": {"salt": {"ready": True}, "water": {"ready": False}},
                                   "meal_prepared": False, "meal_eaten": False}}}
    lines = textworld_dish_lines(state)
    assert lines == "- dish_1: 1/2 ingredients prepared, meal_prepared=False, meal_eaten=False"
    assert textworld_dish_lines({}) == textworld_dish_lines("garbage") == "(unknown)"
    garbage = "x" * 5000  # untrusted: a reply may be anything, of any length
    steps = [{"code": garbage}] * 40
    rubric = {"rubric_items": [{"name": "eaten"}, {"name": "finished"}], "success_gate": "dish_1 eaten"}
    msgs = score_request(rubric, "Prepare and eat dish_1: salt.", {"steps": steps, "finish_message": "done"}, state,
                         style="compact", env="textworld_sync")
    user = msgs[1]["content"]
    assert "[Final State]\n" + lines in user and "eaten, finished; gate: dish_1 eaten" in user
    assert len(user) < COMPACT_TRAJECTORY_CHARS + 600
    node = Node(id="root/subagent-0-0", goal="Prepare and eat dish_1: salt.", depth=1, finish_message="done",
                turns=[Turn(i, [], [], [], 0, code=garbage) for i in range(40)],
                misc={"final_observation": "You are in the pantry.\nDish progress:\n" + lines + "\nShared steps"})
    judge = compact_judge_messages(node.goal, node)
    assert judge[0]["content"] == COMPACT_JUDGE_SYSTEM and "[Final State]\n" + lines in judge[1]["content"]
    assert len(judge[1]["content"]) < COMPACT_TRAJECTORY_CHARS + 600 and dish_progress("") == "(unknown)"


def test_frozen_judge_prompt_fits_the_engine_context():
    tiny = judge_settings(load_config(["configs/tiny_textworld.yaml"]))
    assert tiny["kind"] == "policy_frozen" and tiny["style"] == "compact"
    assert tiny["max_prompt_tokens"] + tiny["max_new_tokens"] <= 2048
    paper = load_config(["configs/paper/textworld_rao.yaml"], ["judge.kind=policy_frozen"])
    assert judge_settings(paper)["max_prompt_tokens"] == 10240 and judge_settings(paper)["style"] == "paper"
