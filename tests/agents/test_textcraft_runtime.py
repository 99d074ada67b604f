"""End-to-end TextCraft trees driven by a scripted policy through the real parsing, sandboxes, worker and records."""

from __future__ import annotations

import asyncio
import io

from sera_jax.agents.harness import Trace
from sera_jax.agents.records import TreeIndex, dumps_tree, read_jsonl, write_jsonl
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import EXHAUSTED_MESSAGE, STUCK_MESSAGE, RuntimeSettings

C1 = "root/subagent-0-0"
C2 = C1 + "/subagent-0-0"
C3 = C2 + "/subagent-0-0"


def py(code: str, thought: str = "next") -> str:
    return f"<thought>{thought}</thought>\n<python>{code}</python>"


def settings(**kw) -> RuntimeSettings:
    return RuntimeSettings.for_env("textcraft", **kw)


def run(task, tok, script, trace=None, **kw):
    gen = ScriptedGenerator(tok, script, policy_version=7)
    return asyncio.run(run_tree(task, "textcraft", gen, tok, settings(**kw), trace=trace)), gen


DELEGATE = py("r = await launch_subagent({'o3_i1': 4}, 'two raw_o5 per four')\nprint(r)", "delegate")
NESTED = {
    "root": [DELEGATE, py("print(craft({'raw_o7': 1, 'o3_i1': 1}, ('o5_i2_15', 3)))\nfinish('root done')")],
    C1: [DELEGATE, py("finish('child 1 done')")],
    C2: [DELEGATE, py("finish('child 2 done')")],
    # Depth 3 may not delegate: it is refused, then crafts itself.
    C3: [DELEGATE, py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made 4 o3_i1')")],
}


def test_nested_delegation_to_depth_3_and_refusal_at_4(tc_task, tok):
    tree, _ = run(tc_task, tok, NESTED)
    assert set(tree.nodes) == {"root", C1, C2, C3}
    idx = TreeIndex.build(tree)
    assert [idx.depth[n] for n in ("root", C1, C2, C3)] == [0, 1, 2, 3]
    assert all(tree.nodes[n].fork_step == 0 for n in (C1, C2, C3))
    deepest = tree.nodes[C3]
    refusal = "Not enough budget to launch subagent for goal Craft the following items: 4x o3_i1"
    assert refusal in deepest.turns[0].output
    assert "Launching a subagent from depth 3 would exceed the maximum allowed depth of 3." in deepest.turns[0].output
    assert [d.kind for d in tree.delegations] == ["default", "default", "default", "refused"]
    # What each parent saw: the child's finish message and the budget line (child's own turns; parent's own left).
    assert tree.nodes[C2].turns[0].output == (
        "made 4 o3_i1\n\nBudget used by subagent: 2/20 steps. Total remaining budget for the current task is 20 "
        "steps.\n\n")
    # The child's goal carries the context; its task string is built from it.
    assert "Context provided from parent agent: two raw_o5 per four" in tree.nodes[C1].goal
    assert "Context provided from parent agent: two raw_o5 per four" in tok.decode(tree.nodes[C1].turns[0].prompt_ids)
    assert tree.nodes[C3].task_misc["initial_inventory"] == {"raw_o7": 3, "raw_o5": 9, "raw_t6": 1}
    assert tree.nodes[C3].task_misc["local_gold_trajectory"][0]["target"] == ["o3_i1", 1]
    assert tree.misc["stats"] == {
        "nodes": 4, "subagent_nodes": 3, "successful_nodes": 4, "max_depth": 3, "turns": 8, "generated_turns": 8,
        "completion_tokens": sum(len(t.completion_ids) for n in tree.nodes.values() for t in n.turns),
        "delegations": 3, "refused_delegations": 1, "root_direct_children": 1, "agent_errors": 0,
        "invalid_launches": 0, "cell_limit_stops": 0}
    # Labels: depth 3 crafted its target; the others finished with their target made by a descendant.
    assert [tree.nodes[n].env_labels["success"] for n in ("root", C1, C2, C3)] == [1.0, 1.0, 1.0, 1.0]
    assert tree.root.turns[-1].reward_misc["reward/success"] == 1.0
    assert tree.root.turns[0].reward_misc["reward/success"] == 0.0
    assert tree.root.turns[-1].reward_misc["final_inventory"]["o5_i2_15"] == 3


def test_concurrent_siblings_share_the_inventory(tc_task, tok):
    script = {
        "root": [py("a, b = await asyncio.gather(launch_subagent({'o3_i1': 4}), launch_subagent({'o3_i1': 4}))\n"
                    "print(a.split(chr(10))[0], '|', b.split(chr(10))[0])\nprint(view_inventory())"),
                 py("finish('two batches')")],
        "root/subagent-0-0": [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))"), py("finish('a')")],
        "root/subagent-0-1": [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))"), py("finish('b')")],
    }
    trace = Trace()
    gen = ScriptedGenerator(tok, script, latency_s=0.3)
    tree = asyncio.run(run_tree(tc_task, "textcraft", gen, tok, settings(), trace=trace))
    kids = ["root/subagent-0-0", "root/subagent-0-1"]
    assert all(tree.nodes[k].fork_step == 0 and tree.nodes[k].parent_id == "root" for k in kids)
    out = tree.root.turns[0].output
    assert out.startswith("a | b\n") and "'o3_i1': 8" in out and "'raw_o5': 5" in out
    # Both children started from the same snapshot and each crafted its own 4 on the shared inventory.
    assert all(tree.nodes[k].task_misc["initial_inventory"]["raw_o5"] == 9 for k in kids)
    assert all(tree.nodes[k].env_labels["success"] == 1.0 for k in kids)
    # They ran at the same time: their generation spans overlap.
    spans = {k: trace.spans("generate_start", "generate_end", node=k) for k in kids}
    a0, a1, _ = spans[kids[0]][0]
    b0, b1, _ = spans[kids[1]][0]
    assert a0 < b1 and b0 < a1
    assert [d.fork_step for d in tree.delegations] == [0, 0]


def test_malformed_replies_are_turn_errors(tc_task, tok):
    script = {"root": [
        "I will just talk and write no code.",
        py("print('unclosed'"),
        py("launch_subagent({'o3_i1': 4})"),
        py("x = 1 / 0"),
        py("asyncio.all_tasks()"),
        py("print(await launch_subagent('not a dict'))"),
        py("print(await launch_subagent({'o3_i1': -1}))"),
        "<thought>no closing tag<python>print('cut off')",
        py("import os"),
        py("finish('gave up')"),
    ]}
    tree, _ = run(tc_task, tok, script)
    t = tree.root.turns
    assert len(t) == 10 and tree.root.finish_message == "gave up"
    assert t[0].code == "" and t[0].error == "No code available to execute."
    assert t[1].error.startswith("Execution failed. Traceback:\nSyntax error in line:")
    assert "requires 'await'" in t[2].error
    assert "ZeroDivisionError" in t[3].output
    assert "all_tasks" in t[4].output + t[4].error
    assert "Error: launch_subagent targets must be a non-empty dict" in t[5].output
    assert "count for o3_i1 must be between 1 and" in t[6].output
    # Each malformed request is counted on its turn and in the tree's stats (nothing was launched).
    assert [t[k].misc.get("invalid_launches", 0) for k in range(10)] == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert tree.misc["stats"]["invalid_launches"] == 2
    assert t[7].output == "cut off\n"  # the missing </python> is appended before parsing
    assert "os" in t[8].output + t[8].error
    assert list(tree.nodes) == ["root"] and not tree.root.rollout_error_zero_reward
    # The user turn after an error carries it on an Error: line.
    assert "Error: No code available to execute." in tok.decode(t[1].prompt_ids)


def test_budget_exhaustion(tc_task, tok):
    script = {"root": [py(f"print({i})") for i in range(10)]}
    tree, _ = run(tc_task, tok, script, max_steps=3)
    assert len(tree.root.turns) == 3
    assert tree.root.error_message == EXHAUSTED_MESSAGE and tree.root.finish_message is None
    assert tree.root.env_labels["success"] == 0.0 and tree.root.reward.environment == 0.0
    assert "budget of 3 steps" in tok.decode(tree.root.turns[0].prompt_ids)


def test_loop_breaker(tc_task, tok):
    script = {"root": [py("print(view_inventory())")] * 6}
    tree, gen = run(tc_task, tok, script)
    turns = tree.root.turns
    assert len(turns) == 5 and len(gen.calls) == 4
    last = turns[-1]
    assert last.completion_id is None and last.completion_ids == [] and last.prompt_ids == []
    assert last.code == f"finish({STUCK_MESSAGE!r})"
    assert tree.root.finish_message == STUCK_MESSAGE and tree.root.env_labels["success"] == 0.0
    # Period 2 needs 8 repeating cells.
    alt = {"root": [py("print(1)"), py("print(2)")] * 6}
    tree, gen = run(tc_task, tok, alt)
    assert len(tree.root.turns) == 9 and len(gen.calls) == 8 and tree.root.finish_message == STUCK_MESSAGE


def test_truncation_keeps_system_and_task_and_records_what_was_sent(tc_task, tok):
    # Each cell prints ~300 characters; a 2,600-token cap forces old pairs out.
    script = {"root": [py(f"print('{k}' * 300)") for k in "abcdefgh"] + [py("finish('x')")]}
    tree, _ = run(tc_task, tok, script, max_prompt_tokens=2600)
    turns = tree.root.turns
    assert all(len(t.prompt_ids) <= 2600 for t in turns)
    dropped = [t.misc["dropped_pairs"] for t in turns]
    assert dropped[0] == 0 and sum(dropped) > 0
    first = tok.decode(turns[0].prompt_ids)
    system_and_task = first[: first.index("<|im_start|>assistant")]
    for t in turns:
        text = tok.decode(t.prompt_ids)
        assert text.startswith(system_and_task) and text.endswith("<|im_start|>assistant\n")
    k = next(i for i, d in enumerate(dropped) if d)
    assert "'a' * 300" not in tok.decode(turns[k].prompt_ids)
    # After a deletion the kept list is what the next turn extends (sequence extension resumes).
    if k + 1 < len(turns) and dropped[k + 1] == 0:
        assert turns[k + 1].prompt_ids[:len(turns[k].prompt_ids)] == turns[k].prompt_ids


def test_records_hold_every_token_and_round_trip(tc_task, tok):
    tree, gen = run(tc_task, tok, NESTED)
    n_gen = sum(1 for n in tree.nodes.values() for t in n.turns if t.completion_id is not None)
    assert n_gen == len(gen.calls) == 8
    for node in tree.nodes.values():
        script = NESTED[node.id]
        for t in node.turns:
            assert len(t.logprobs) == len(t.completion_ids) > 0 and t.policy_version == 7
            assert all(lp < 0 for lp in t.logprobs)
            # Exactly the generated tokens: the scripted reply, cut after </python>.
            assert t.completion_ids == tok.encode(script[t.index])
            assert t.completion_text == script[t.index]
        # Sequence extension: each prompt extends the previous prompt + completion (no truncation here).
        for a, b in zip(node.turns, node.turns[1:]):
            assert b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids
    buf = io.StringIO()
    write_jsonl([tree], buf)
    back = list(read_jsonl(io.StringIO(buf.getvalue())))
    assert back == [tree] and dumps_tree(back[0]) == dumps_tree(tree)


def test_deterministic_mode_replays_exactly(tc_task, tok):
    script = {
        "root": [py("a, b = await asyncio.gather(launch_subagent({'o3_i1': 4}), launch_subagent({'o3_i1': 4}))\n"
                    "print(a, b)"), py("print(view_inventory())\nfinish('ok')")],
        "root/subagent-0-0": [DELEGATE, py("print(view_inventory())\nfinish('a')")],
        "root/subagent-0-0/subagent-0-0": [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('a1')")],
        "root/subagent-0-1": [py("print(view_inventory())"), py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))"),
                              py("finish('b')")],
    }
    a, _ = run(tc_task, tok, script, deterministic=True, seed=3)
    b, _ = run(tc_task, tok, script, deterministic=True, seed=3)
    assert dumps_tree(a) == dumps_tree(b)
    # Sequential siblings in launch order: child 1 saw child 0's crafts.
    assert "'o3_i1': 4" in a.nodes["root/subagent-0-1"].turns[0].output
    c, _ = run(tc_task, tok, script, deterministic=True, seed=4)
    assert c.root.turns[0].logprobs != a.root.turns[0].logprobs  # the seed reaches the turn keys
    assert c.root.turns[0].completion_ids == a.root.turns[0].completion_ids


def test_cell_limits_are_turn_errors_and_the_agent_goes_on(tc_task, tok):
    from envs_py.sandbox import Limits

    script = {"root": [py("while True:\n    pass"), py("print('still here')\nfinish('ok')")]}
    tree, _ = run(tc_task, tok, script, cell_limits=Limits(cpu_s=0.5, wall_s=2.0))
    spin, after = tree.root.turns
    assert spin.misc["cell_limit"] in ("cpu", "wall", "killed") and (spin.error or spin.output)
    assert after.output.startswith("still here") and tree.root.finish_message == "ok"
