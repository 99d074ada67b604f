"""Runtime records are what credit assignment consumes: execution datums merge each agent's turns, delegation datums
find the launch statements / delegate blocks inside the recorded completions."""

from __future__ import annotations

import asyncio

from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.datums import delegation_datums, execution_datums
from tests.agents.test_textcraft_runtime import NESTED
from tests.agents.test_textworld_runtime import nested_script


def _tree(task, env, tok, script):
    return asyncio.run(run_tree(task, env, ScriptedGenerator(tok, script), tok, RuntimeSettings.for_env(env)))


def test_textcraft_tree_to_datums(tc_task, tok):
    tree = _tree(tc_task, "textcraft", tok, NESTED)
    ex = execution_datums(tree, mode="rao")
    # One datum per agent: its turns extend one another (sequence extension), all rewarded with env success 1.
    assert sorted(d.node_id for d in ex) == sorted(tree.nodes) and all(d.reward == 1.0 for d in ex)
    for d in ex:
        node = tree.nodes[d.node_id]
        assert d.num_trained == sum(len(t.completion_ids) for t in node.turns)
    dl = delegation_datums(tree, tok.decode, env="textcraft")
    # Three accepted launches (depth 0→1→2→3) plus the refused attempt at depth 3 (no child: an invalid attempt).
    assert len(dl) == 4 and sum(d.meta["invalid"] for d in dl) == 1
    for d in dl:
        trained = [t for t, m in zip(d.tokens, d.mask) if m]
        assert "launch_subagent" in tok.decode(trained)


def test_textworld_tree_to_datums(tw_task, tok):
    tree = _tree(tw_task, "textworld_sync", tok, nested_script(tw_task))
    dl = delegation_datums(tree, tok.decode, env="textworld_sync")
    assert dl and all("<delegate>" in tok.decode([t for t, m in zip(d.tokens, d.mask) if m]) for d in dl)
    assert {d.node_id for d in dl if not d.meta["invalid"]} == {"root", "root/subagent-4-0",
                                                                "root/subagent-4-0/subagent-0-0"}
    assert execution_datums(tree, mode="rao", filter_errors=False)
