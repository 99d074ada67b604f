"""The tree world: shared inventory, sub-agent records, fork isolation, commit, digest, launch validation."""

from envs_py.core import Env
from envs_py.textcraft import TextCraftWorld, load_tasks


def world():
    return TextCraftWorld.from_task(load_tasks("val")[0])  # 3x o5_i2_15 from raw_o7 3, raw_o5 9, raw_t6 1


def test_protocol_and_step():
    w = world()
    assert isinstance(w, Env)
    r = w.step("root", ("craft", ({"raw_o5": 2}, ("o3_i1", 4)), {}))
    assert r.observation == "Successfully crafted 4 o3_i1(s)" and not r.done
    assert w.step("root", ("view_inventory", (), {})).infos["value"]["o3_i1"] == 4
    assert w.step("root", ("nope", (), {})).observation.startswith("Error: unknown tool")
    assert w.step("root", "garbage").error
    assert w.call_tool("root", "craft", ({"a": 1},), {}).startswith("Error: craft() missing")
    assert w.step("root", ("finish", ("ok",), {})).done


def test_fork_is_isolated_and_commit_adopts_branch():
    w = world()
    d0 = w.digest()
    b = w.fork()
    assert b.digest() == d0
    b.tools("root")["craft"]({"raw_o5": 2}, ("o3_i1", 4))
    assert w.digest() == d0 and "o3_i1" not in w.inventory and b.inventory["o3_i1"] == 4
    w.tools("root")["craft"]({"raw_o5": 4}, ("o3_i1", 8))
    assert b.inventory["o3_i1"] == 4  # the parent's later crafts do not leak into the branch
    shared = w.inventory
    w.commit(b)
    assert w.inventory is shared and w.inventory == b.inventory and w.digest() == b.digest()
    b.tools("root")["craft"]({"raw_o5": 2}, ("o3_i1", 4))
    assert w.inventory["o3_i1"] == 4


def test_subagents_share_inventory_and_are_checked_on_net_increase():
    w = world()
    w.tools("root")["craft"]({"raw_o5": 2}, ("o3_i1", 4))
    w.add_agent("c1", {"o3_i1": 4}, "root")
    assert w.agents["c1"].start_inventory["o3_i1"] == 4 and w.agents["c1"].depth == 1
    c = w.tools("c1")
    c["finish"]("done")
    assert not w.check("c1").success  # the 4 held at its start do not count
    c["craft"]({"raw_o5": 2}, ("o3_i1", 4))
    assert w.check("c1").success and w.inventory["o3_i1"] == 8  # one inventory for the whole tree
    assert not w.check("nobody").success


def test_launch_validation_and_depth_limit():
    w = world()
    req = w.subagent_request("root", {"o3_i1": 4}, "use raw_o5")
    assert req == {"goal": "Craft the following items: 4x o3_i1\n\nContext provided from parent agent: use raw_o5",
                   "targets": {"o3_i1": 4}, "context": "use raw_o5", "depth": 1}
    assert "error" in w.subagent_request("root", ["o3_i1"])
    assert "error" in w.subagent_request("root", {"o3_i1": 0})
    assert "error" in w.subagent_request("root", {"o3_i1": 1}, 5)
    parent = "root"
    for d in range(1, 4):
        w.add_agent(f"d{d}", {"o3_i1": 1}, parent)
        parent = f"d{d}"
    refusal = w.subagent_request("d3", {"o3_i1": 1})["error"]
    assert refusal.startswith("Not enough budget to launch subagent for goal Craft the following items: 1x o3_i1.")
    assert "from depth 3 would exceed the maximum allowed depth of 3" in refusal
