"""The TextWorld-Sync reply protocol parser and the runtime's fixed texts (docs/design/textworld.md §10)."""

import random
import string

import pytest

from envs_py.textworld_sync import load_tasks, make_world, parse_reply
from envs_py.textworld_sync.messages import (
    child_agent_id, depth_rejection_text, inventory_lookup_text, invalid_reply_text, subagent_results_text,
    task_message_text, turn_feedback_text,
)
from envs_py.textworld_sync.protocol import Delegation, fallback_command


def test_well_formed_blocks():
    r = parse_reply("I will grab it.\n<action>take white onion</action>")
    assert (r.kind, r.command, r.error) == ("action", "take white onion", "")
    r = parse_reply("<ACTION>\n  dice white onion \n</Action>")
    assert r.kind == "action" and r.command == "dice white onion"
    for text in ["<action>inventory</action>", "<action>View  Inventory</action>", "<action>check inventory</action>"]:
        r = parse_reply(text)
        assert r.kind == "inventory" and r.command in {"inventory", "view inventory", "check inventory"}
    r = parse_reply('<delegate>{"goal": "Prepare dish_1 and eat it.", "max_steps": 8}</delegate>')
    assert r.kind == "delegate" and r.delegations == (Delegation("Prepare dish_1 and eat it.", 8),)
    r = parse_reply('<delegate>{"goal": "Cook dish_2"}</delegate>')
    assert r.delegations == (Delegation("Cook dish_2", 20),)
    r = parse_reply('<delegate>\n{"delegations": [{"goal": "a"}, {"goal": "b", "max_steps": 3}]}\n</delegate>')
    assert r.kind == "delegate" and r.delegations == (Delegation("a", 20), Delegation("b", 3))
    r = parse_reply("<finish>dish_1 is prepared\nand eaten</finish>")
    assert r.kind == "finish" and r.message == "dish_1 is prepared\nand eaten"
    r = parse_reply("<action>look around</action> then <action>take salt</action>")
    assert r.kind == "action" and r.command == "look around"  # several of one kind: the first


@pytest.mark.parametrize("text, reason, fallback", [
    ("", "found: none", ""),
    ("take salt", "found: none", "take salt"),
    ("Thinking...\nAction: 'go to pantry'", "found: none", "go to pantry"),
    ("plan:\n```\nlook around\ntake salt\n```\ndone", "found: none", "take salt"),
    ("<action>take salt</action><finish>done</finish>", "found: action, finish", "take salt"),
    ("<action>  </action>", "action block is empty", "<action>  </action>"),
    ("<finish></finish>", "finish block is empty", "<finish></finish>"),
    ("<action>take salt", "found: none", "<action>take salt"),
    ("<delegate>{goal: x}</delegate>", "not valid JSON", "<delegate>{goal: x}</delegate>"),
    ('<delegate>["a"]</delegate>', "must be a JSON object", '<delegate>["a"]</delegate>'),
    ('<delegate>{"goal": ""}</delegate>', "non-empty string 'goal'", '<delegate>{"goal": ""}</delegate>'),
    ('<delegate>{"goal": 5}</delegate>', "non-empty string 'goal'", '<delegate>{"goal": 5}</delegate>'),
    ('<delegate>{"goal": "x", "max_steps": 0}</delegate>', "positive integer", None),
    ('<delegate>{"goal": "x", "max_steps": "3"}</delegate>', "positive integer", None),
    ('<delegate>{"goal": "x", "max_steps": true}</delegate>', "positive integer", None),
    ('<delegate>{"goal": "x", "max_steps": 2.5}</delegate>', "positive integer", None),
    ('<delegate>{"delegations": []}</delegate>', "non-empty list", None),
    ('<delegate>{"delegations": [{"goal": "a"}, "b"]}</delegate>', "delegation 1 must be a JSON object", None),
])
def test_malformed_replies_are_invalid_with_clear_errors(text, reason, fallback):
    r = parse_reply(text)
    assert r.kind == "invalid" and r.error.startswith("Invalid response: ")
    assert reason in r.error and "<action>COMMAND</action>" in r.error
    if fallback is not None:
        assert r.fallback == fallback


def test_fallback_rules():
    assert fallback_command("<action>take salt</action><delegate>{}</delegate>") == "take salt"
    assert fallback_command("x\n```python\nprint(1)\ncommand: eat dish_1\n```") == "command: eat dish_1"
    assert fallback_command("blah\n  command: `prepare dish_2`  \n\n") == "prepare dish_2"
    assert parse_reply("I should check.\ninventory").fallback_is_inventory


def test_parser_never_raises_on_garbage():
    rng = random.Random(3)
    alphabet = string.printable + "<>/{}[]\"'`" * 5
    pieces = ["<action>", "</action>", "<delegate>", "</delegate>", "<finish>", "</finish>", '{"goal":', "```"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) if rng.random() < 0.3 else rng.choice(alphabet)
                       for _ in range(rng.randint(0, 60)))
        r = parse_reply(text)
        assert r.kind in {"action", "inventory", "delegate", "finish", "invalid"}
        assert (r.kind == "invalid") == bool(r.error)
    for weird in [None, 42, b"<action>x</action>", ["<finish>a</finish>"], "<delegate>" + "[" * 100000 + "</delegate>"]:
        assert parse_reply(weird).kind in {"action", "invalid", "finish"}


def test_invalid_reply_costs_a_turn_not_a_crash():
    world = make_world(load_tasks("sample")[0])
    reply = parse_reply("I think I'll take the onion now")
    assert reply.kind == "invalid"
    result = world.step("root", reply.fallback)  # the reference sends the fallback: one global step, rejected
    assert result.error and world.steps == 1
    text = invalid_reply_text(reply.error, result.observation)
    assert text.startswith("Invalid response:") and text.endswith("Valid Actions are listed below.")


def test_runtime_texts():
    obs = "You are in the kitchen."
    assert child_agent_id("root/subagent-3-0", 0, 1) == "root/subagent-3-0/subagent-0-1"
    assert inventory_lookup_text("white onion", obs) == (
        "[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\nwhite onion\n\n"
        "Current environment observation:\nYou are in the kitchen.")
    assert depth_rejection_text(3, obs) == (
        "SubAgent delegation rejected: current depth 3 reached the maximum allowed depth 3.\nYou are in the kitchen.")
    text = subagent_results_text([
        {"agent_id": "root/subagent-2-0", "returned_to_parent": True, "environment_success": False, "steps": 5,
         "max_steps": 8, "finish_message": "dish_1 done", "final_observation": "x" * 2000},
        {"agent_id": "root/subagent-2-1", "steps": 8, "max_steps": 8},
    ], obs)
    lines = text.splitlines()
    assert lines[0] == "[SubAgent Results]"
    assert lines[1] == "- Agent root/subagent-2-0: returned=True, environment_success=False, steps=5"
    assert lines[2] == ("  Budget used by subagent: 5/8 steps. Total remaining budget for this SubAgent task "
                        "is 3 steps.")
    assert lines[3] == "  result: dish_1 done" and lines[4] == "  final observation: " + "x" * 1200
    assert lines[7] == "  result: (no explicit finish message)"
    assert lines[-3:] == ["", "[Current Environment Observation]", obs]
    feedback = turn_feedback_text(2, obs, 20, {"validActions": ["look around"], "score": 0.0, "done": False})
    assert feedback.startswith("[Step 2 Observation]\nYou are in the kitchen.")
    assert "Budget used by current Agent: 3/20 steps." in feedback
    assert "Current Agent remaining budget: 17 steps." in feedback and "- look around" in feedback


def test_first_message_information_content():
    world = make_world(load_tasks("sample")[0])
    obs, infos = world.observe_full("root")
    text = task_message_text(world.task.goal, 20, obs, infos["validActions"])
    assert text.startswith("# Task\nPrepare and eat 2 independent dishes.")
    assert "Budget: You have a total budget of 20 steps to complete this task." in text
    assert "# Initial Observation\n" + obs in text and "- take white onion" in text
    assert "<delegate>" in text and "<finish>" in text and text.endswith("first action or delegation.")
    solo = task_message_text("goal", 5, obs, ["look around"], subagents_enabled=False)
    assert "<delegate>" not in solo and "<action>inventory</action>" in solo
