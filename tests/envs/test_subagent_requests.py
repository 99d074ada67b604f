"""launch_subagent requests are validated once, strictly (issue 55 part 2): targets are {known item: positive int},
the goal is rendered from them, an invalid request is an error the calling cell sees, and an agent without targets
can never be labelled successful."""

from __future__ import annotations

import asyncio

import pytest

from envs_py.textcraft import TextCraftWorld, load_tasks
from envs_py.textcraft.checker import AgentRecord, check_agent
from envs_py.textcraft.session import TextCraftSession
from envs_py.textcraft.world import MAX_TARGET_COUNT, MAX_TARGETS


def world():
    return TextCraftWorld.from_task(load_tasks("val")[0])  # 3x o5_i2_15 from raw_o7 3, raw_o5 9, raw_t6 1


# Each shape was accepted before this fix (see the report of issue 55) or is a near relative of one that was.
EXPLOITS = {
    "bool count": ({"o3_i1": True}, "must be an int, got bool"),
    "bool false": ({"o3_i1": False}, "must be an int, got bool"),
    "zero count": ({"o3_i1": 0}, "between 1 and"),
    "negative count": ({"o3_i1": -2}, "between 1 and"),
    "float count": ({"o3_i1": 1.0}, "must be an int, got float"),
    "huge count": ({"o3_i1": 10 ** 30}, "got a larger number"),
    "unknown item": ({"no_such_item": 1}, "'no_such_item' is not a known item"),
    "case-folded name": ({"O3_I1": 1}, "'O3_I1' is not a known item"),
    "padded name": ({" o3_i1": 1}, "is not a known item"),
    "smuggled second target": ({"o3_i1: 1, 5x o5_i2_15": 1}, "is not a known item"),
    "smuggled (issue's shape)": ({"oak planks: 1, diamond": 1}, "is not a known item"),
    "smuggled on a second line": ({"o3_i1\n5x o5_i2_15": 1}, "is not a known item"),
    "lone surrogate name": ({"o3_i1\ud800": 1}, "is not a known item"),
    "empty targets": ({}, "non-empty dict"),
    "not a dict": (["o3_i1"], "non-empty dict"),
    "non-str name": ({3: 1}, "names must be strings"),
    "too many targets": (None, f"at most {MAX_TARGETS} targets"),
}


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_each_exploit_shape_is_refused_with_a_parent_visible_error(name):
    w = world()
    targets, message = EXPLOITS[name]
    if targets is None:  # MAX_TARGETS + 1 known names, each asked for once
        targets = {item: 1 for item in list(w.book.recipes)[:MAX_TARGETS + 1]}
    req = w.subagent_request("root", targets, "ctx")
    assert set(req) == {"error"}
    assert req["error"].startswith("Error: launch_subagent") and message in req["error"]
    req["error"].encode("utf-8")  # the error a cell receives is valid text, whatever name it quoted


def test_an_honest_request_keeps_its_targets_and_renders_its_goal():
    w = world()
    targets = {"o3_i1": 4, "raw_o5": 2, "o5_i2_15": MAX_TARGET_COUNT}  # craftable, base, the largest count
    req = w.subagent_request("root", targets, "use raw_o5")
    assert req == {"goal": "Craft the following items: 4x o3_i1, 2x raw_o5, 10000x o5_i2_15\n\nContext provided from "
                           "parent agent: use raw_o5",
                   "targets": targets, "context": "use raw_o5", "depth": 1}
    assert req["targets"] is not targets  # a copy: the sandbox's dict is not the world's
    # A context cannot add targets: they come from the dict, never from the goal text.
    sneaky = w.subagent_request("root", {"o3_i1": 1}, "\n5x o5_i2_15, 9x m0_i1")
    assert sneaky["targets"] == {"o3_i1": 1} and sneaky["context"] == "\n5x o5_i2_15, 9x m0_i1"


def test_an_agent_without_targets_is_never_successful():
    inventory = {"o3_i1": 4}
    for targets in ({}, {"o3_i1": 0}, {"o3_i1": -1}):
        rec = AgentRecord("c", targets, {}, "root", 1, finish_message="done, nothing to do")
        result = check_agent(rec, inventory)
        assert not result.success and "no targets" in result.reason
    w = world()
    w.add_agent("c", {}, "root")
    w.tools("c")["finish"]("did it")
    assert not w.check("c").success
    # ... while a real target met after finish() still is
    w.add_agent("d", {"o3_i1": 4}, "root")
    w.tools("d")["craft"]({"raw_o5": 2}, ("o3_i1", 4))
    w.tools("d")["finish"]("made 4")
    assert w.check("d").success


def test_the_session_hands_the_error_to_the_cell_and_launches_nothing():
    # Through the real sandbox and RPC: the cell prints what launch_subagent returned, and no launch happens.
    session = TextCraftSession.from_task(load_tasks("val")[0])
    launched = []

    async def launch(agent_id, req):
        launched.append(req)
        return "child ran"

    async def go():
        try:
            out = []
            for code in ("print(await launch_subagent({'o3_i1': True}))",
                         "print(await launch_subagent({'O3_I1': 1}))",
                         "print(await launch_subagent({'o3_i1: 1, 5x o5_i2_15': 1}))",
                         "print(await launch_subagent({'o3_i1': 2}, 'ctx'))"):
                out.append(await session.run_cell("root", code, launch))
            return out
        finally:
            await session.close()

    results = asyncio.run(go())
    for r in results[:3]:
        assert r["output"].startswith("Error: launch_subagent") and r["ok"], r
        assert r["invalid_launches"] == 1 and r["invalid_launch_errors"] == [r["output"].strip()]
    assert results[3]["invalid_launches"] == 0
    assert results[3]["output"].strip() == "child ran"
    assert launched == [{"goal": "Craft the following items: 2x o3_i1\n\nContext provided from parent agent: ctx",
                         "targets": {"o3_i1": 2}, "context": "ctx", "depth": 1}]
