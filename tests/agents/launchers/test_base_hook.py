"""The launcher hook the next stages plug into: a strategy sees the delegation, forks the world, runs children on
branches, commits one and tells the parent its own text (the shape of a counterfactual collector)."""

from __future__ import annotations

import asyncio
import dataclasses

from sera_jax.agents.launchers.base import LaunchOutcome
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings


class BranchingLauncher:
    """Runs each requested child on two forks of the world, commits branch 0, and answers with its own text."""

    def __init__(self):
        self.seen = []

    async def launch(self, req):
        self.seen.append(dict(parent=req.parent.id, fork_step=req.fork_step, action=req.parent_action,
                              roles=[m["role"] for m in req.parent_messages], state=await req.env.state(),
                              specs=list(req.specs)))
        children = []
        for spec in req.specs:
            branches = [await req.env.fork() for _ in range(2)]
            nodes = [await req.start_child(dataclasses.replace(spec, child_id=f"{spec.child_id}#b{i}"), env=b)
                     for i, b in enumerate(branches)]
            for i, n in enumerate(nodes):
                n.branch_index = i
            await req.env.commit(branches[0])
            for b in branches:
                await b.close()
            children.append(nodes[0])
        return LaunchOutcome(children=children, kind="counterfactual",
                             texts=[f"{c.finish_message}\n\nSelected branch: 0; counterfactual branches collected: 2.\n"
                                    for c in children], misc={"branches": 2})


def py(code):
    return f"<thought>t</thought>\n<python>{code}</python>"


def test_textcraft_branching_launcher(tc_task, tok):
    child = [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made')")]
    script = {"root": [py("print(view_inventory())"), py("r = await launch_subagent({'o3_i1': 4})\nprint(r)"),
                       py("print(view_inventory())\nfinish('ok')")],
              "root/subagent-1-0#b0": child, "root/subagent-1-0#b1": child}
    launcher = BranchingLauncher()
    tree = asyncio.run(run_tree(tc_task, "textcraft", ScriptedGenerator(tok, script), tok,
                                RuntimeSettings.for_env("textcraft"), launcher=launcher))
    seen = launcher.seen[0]
    assert seen["parent"] == "root" and seen["fork_step"] == 1
    assert "launch_subagent({'o3_i1': 4})" in seen["action"]
    assert seen["roles"] == ["system", "user", "assistant", "user"]  # before the delegating action
    assert seen["state"] == {"inventory": {"raw_o7": 3, "raw_o5": 9, "raw_t6": 1}}
    assert tree.root.turns[1].output == "made\n\nSelected branch: 0; counterfactual branches collected: 2.\n\n"
    # Both branches crafted in isolation; only branch 0's world was committed (4, not 8, o3_i1).
    assert "'o3_i1': 4" in tree.root.turns[2].output and "'raw_o5': 7" in tree.root.turns[2].output
    assert {n.branch_index for n in tree.nodes.values() if n.parent_id == "root"} == {0, 1}
    assert tree.delegations[0].kind == "counterfactual" and tree.delegations[0].misc == {"branches": 2}


def test_textworld_branching_launcher(tw_task, tok):
    script = {"root": ['<delegate>{"goal": "take something"}</delegate>', "<finish>done</finish>"],
              "root/subagent-0-0#b0": ["<action>take white onion</action>", "<finish>took it</finish>"],
              "root/subagent-0-0#b1": ["<action>look around</action>", "<finish>looked</finish>"]}
    launcher = BranchingLauncher()
    tree = asyncio.run(run_tree(tw_task, "textworld_sync", ScriptedGenerator(tok, script), tok,
                                RuntimeSettings.for_env("textworld_sync"), launcher=launcher))
    assert "dishes" in launcher.seen[0]["state"] and launcher.seen[0]["action"].startswith("<delegate>")
    assert launcher.seen[0]["roles"] == ["system", "user"]
    assert tree.root.turns[0].output.startswith("took it\n\nSelected branch: 0")
    assert tree.delegations[0].result == tree.root.turns[0].output

