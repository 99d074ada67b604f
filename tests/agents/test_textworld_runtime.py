"""End-to-end TextWorld-Sync trees driven by a scripted policy through the real protocol, world and records."""

from __future__ import annotations

import asyncio
import io
import json

from envs_py.textworld_sync import oracle_split_actions
from sera_jax.agents.records import TreeIndex, dumps_tree, read_jsonl, write_jsonl
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings

C1 = "root/subagent-4-0"
C2 = C1 + "/subagent-0-0"
C3 = C2 + "/subagent-0-0"
WORKERS = [C1 + "/subagent-1-0", C1 + "/subagent-1-1"]


def delegate(*goals, max_steps=None) -> str:
    items = [{"goal": g, **({"max_steps": max_steps} if max_steps else {})} for g in goals]
    body = items[0] if len(items) == 1 else {"delegations": items}
    return f"thinking first\n<delegate>{json.dumps(body)}</delegate>"


def nested_script(task) -> dict:
    script = {
        "root": [
            "<action>inventory</action>",                      # free look-up, no world step
            "I am not sure.\naction: look around",             # invalid; its fallback still costs a world step
            "<delegate>{goal: 'unquoted'}</delegate>",         # bad JSON -> invalid
            "<action>look around</action><finish>x</finish>",  # two kinds of block -> invalid
            delegate("coordinate the whole meal", max_steps=5),
        ],
        C1: [delegate("go one level deeper"),
             delegate("prepare and eat dish_1", "prepare and eat dish_2")],
        C2: [delegate("deeper still"), "<finish>level 2 done</finish>"],
        C3: [delegate("too deep"), "<finish>level 3 done</finish>"],
    }
    for agent, action in oracle_split_actions(task, 2):
        script.setdefault(WORKERS[int(agent[-1])], []).append(f"<action>{action}</action>")
    return script


def run(task, tok, script, pool=None, **kw):
    gen = ScriptedGenerator(tok, script, policy_version=3)
    s = RuntimeSettings.for_env("textworld_sync", **kw)
    return asyncio.run(run_tree(task, "textworld_sync", gen, tok, s, pool=pool)), gen


def test_nested_delegation_refusal_siblings_and_malformed_replies(tw_task, tok):
    tree, gen = run(tw_task, tok, nested_script(tw_task))
    assert set(tree.nodes) == {"root", C1, C2, C3, *WORKERS}
    idx = TreeIndex.build(tree)
    assert [idx.depth[n] for n in ("root", C1, C2, C3, WORKERS[0])] == [0, 1, 2, 3, 2]
    root = tree.root
    kinds = [t.misc["reply_kind"] for t in root.turns]
    assert kinds == ["inventory", "invalid", "invalid", "invalid", "delegate"]
    assert root.turns[0].output.startswith("[Inventory Lookup]\nCurrent shared inventory")
    assert "exactly one action, delegate, or finish block (found: none)" in root.turns[1].error
    assert root.turns[1].misc["fallback"] == "look around"
    assert "not valid JSON" in root.turns[2].error and "found: action, finish" in root.turns[3].error
    # Inventory look-ups are free; the fallbacks of the two invalid replies cost world steps (the two-kinds reply's
    # fallback is its action block).
    limit = tw_task.max_steps
    assert f"Shared steps remaining: {limit}\n" in root.turns[0].output
    assert f"Shared steps remaining: {limit - 1}\n" in root.turns[1].output
    assert f"Shared steps remaining: {limit - 3}\n" in root.turns[3].output
    feedback = tok.decode(root.turns[1].prompt_ids)
    assert "[Step 0 Observation]\n[Inventory Lookup]" in feedback
    assert "Budget used by current Agent: 1/20 steps." in feedback
    # The depth-3 agent's delegation is refused, costs it a turn, and creates nothing.
    deep = tree.nodes[C3]
    assert deep.turns[0].output.startswith(
        "SubAgent delegation rejected: current depth 3 reached the maximum allowed depth 3.\n")
    assert deep.finish_message == "level 3 done"
    assert [d.kind for d in tree.delegations].count("refused") == 1
    # The requested budget caps the child's own turns; the parent's view is the [SubAgent Results] block.
    assert tree.nodes[C1].max_steps == 5 and tree.nodes[WORKERS[0]].max_steps == 20
    c2_view = tree.nodes[C2].turns[0].output
    assert c2_view.startswith(f"[SubAgent Results]\n- Agent {C3}: returned=True, environment_success=False, "
                              "steps=2\n  Budget used by subagent: 2/20 steps. Total remaining budget for this "
                              "SubAgent task is 18 steps.\n  result: level 3 done\n  final observation: ")
    assert "\n[Current Environment Observation]\n" in c2_view
    # Two siblings on the shared world solved both dishes between them.
    c1_view = tree.nodes[C1].turns[1].output
    assert all(f"- Agent {w}: returned=False, environment_success=True" in c1_view for w in WORKERS)
    assert all(tree.nodes[n].fork_step == 1 for n in WORKERS)
    assert root.env_labels["success"] == 1.0 and root.reward.environment == 1.0
    assert root.misc["environment_success"] and not root.misc["returned_to_parent"]
    assert tree.nodes[C2].misc["returned_to_parent"] is True
    # Every generated turn is in the records with its tokens, logprobs and version; JSONL round-trips.
    turns = [t for n in tree.nodes.values() for t in n.turns]
    assert len(turns) == len(gen.calls)
    for t in turns:
        assert len(t.logprobs) == len(t.completion_ids) > 0 and t.policy_version == 3
        assert t.completion_ids[-1] == tok.im_end_id and t.completion_text == t.code + "<|im_end|>"
    buf = io.StringIO()
    write_jsonl([tree], buf)
    assert list(read_jsonl(io.StringIO(buf.getvalue()))) == [tree]


def test_budget_exhaustion_and_finish_to_parent(tw_task, tok):
    script = {
        "root": [delegate("look around twice", max_steps=2), "<finish>root gives up</finish>"],
        "root/subagent-0-0": ["<action>look around</action>"] * 5,
    }
    tree, _ = run(tw_task, tok, script)
    child = tree.nodes["root/subagent-0-0"]
    assert len(child.turns) == 2 and child.finish_message is None and child.max_steps == 2
    assert not child.misc["returned_to_parent"] and child.misc["remaining_steps"] == 0
    assert "result: (no explicit finish message)" in tree.root.turns[0].output
    assert tree.root.finish_message == "root gives up" and tree.root.env_labels["success"] == 0.0
    assert "Budget used by current Agent: 1/2 steps." in tok.decode(child.turns[1].prompt_ids)


def test_env_processes_and_deterministic_replay(tw_task, tok):
    script = nested_script(tw_task)

    async def both():
        pool = await start_pool(1)
        try:
            s = RuntimeSettings.for_env("textworld_sync", deterministic=True, seed=11)
            out = []
            for _ in range(2):
                gen = ScriptedGenerator(tok, script)
                out.append(await run_tree(tw_task, "textworld_sync", gen, tok, s, pool=pool))
            return out
        finally:
            await pool.close()

    a, b = asyncio.run(both())
    assert dumps_tree(a) == dumps_tree(b)
    assert a.root.env_labels["success"] == 1.0 and a.misc["final_digest"] == b.misc["final_digest"]
    # Deterministic siblings interleave in lockstep: worker 0 then worker 1 in every tick (the root's three
    # invalid replies cost three world steps before they start).
    w0, w1 = (a.nodes[w] for w in WORKERS)
    left = tw_task.max_steps - 3
    for k in range(4):
        assert f"Shared steps remaining: {left - 2 * k - 1}\n" in w0.turns[k].output
        assert f"Shared steps remaining: {left - 2 * k - 2}\n" in w1.turns[k].output
