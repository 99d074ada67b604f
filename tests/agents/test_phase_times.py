"""Wall time by phase from the runtime's trace: interval arithmetic, a delegating TextCraft tree whose child's turns
count as generation (not as the parent cell's env time), slow worlds whose steps land in env (union vs busy time
with two trees at once), and side calls and judge requests of a TextWorld rubric-generation tree as spans."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from envs_py.workers import WorkerPool
from sera_jax.agents.envs import RUNTIME_FACTORIES
from sera_jax.agents.judge import PolicyJudge
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.phases import (
    Trace,
    phase_intervals,
    phase_times,
    subtract,
    tracing,
    union,
)
from sera_jax.agents.runtime import run_tree, run_trees
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.stages import method_config
from sera_jax.training.stats import tree_metrics
from tests.agents.rubric_scripts import TW_ROOT, rubric_text, score_text


def _trace(spans):
    """A Trace with hand-timed spans: (kind, t0, t1, fields)."""
    tr = Trace()
    for i, (kind, t0, t1, fields) in enumerate(spans):
        tr.events += [{"t": t0, "kind": f"{kind}_start", "span": i, **fields},
                      {"t": t1, "kind": f"{kind}_end", "span": i, **fields}]
    tr.events.sort(key=lambda e: e["t"])
    return tr


def test_interval_arithmetic_and_overlap_rules():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert subtract((0, 10), [(1, 2), (4, 6), (9, 12)]) == [(0, 1), (2, 4), (6, 9)]
    a, b = {"tree": "t", "node": "root"}, {"tree": "t", "node": "root/subagent-0-0"}
    tr = _trace([("generate", 0, 2, a), ("generate", 1, 3, b),        # two agents generate at once
                 ("env", 3, 9, a), ("launch", 4, 8, a),               # a cell waiting 4 s on its child
                 ("generate", 4, 5, b), ("env", 5, 6, b), ("generate", 6, 7, b),
                 ("score", 8.5, 9.5, b), ("judge", 9, 11, {"node": b["node"]}),
                 ("generate", 11, 30, a)])                           # past the window: clipped at 12
    t = phase_times(tr, 0.0, 12.0)
    assert t["generation_busy_s"] == pytest.approx(2 + 2 + 1 + 1 + 1) and t["generation_s"] == pytest.approx(6)
    assert t["env_s"] == t["env_busy_s"] == pytest.approx(1 + 1 + 1)  # 3–4 and 8–9 of the cell, 5–6 of the child
    assert t["scoring_busy_s"] == pytest.approx(3) and t["scoring_s"] == pytest.approx(2.5)
    assert t["uncovered_s"] == pytest.approx(1.0)  # 7–8: the launch is still open, no phase span is
    assert union(phase_intervals(tr, 0, 12)["env"]) == [(3, 4), (5, 6), (8, 9)]


def py(code):
    return f"<thought>go</thought>\n<python>{code}</python>"


def test_delegated_child_counts_as_generation_not_as_the_parents_env(tc_task, tok):
    """The root's cell awaits a child that generates two slow turns: those 2 × 0.3 s are generation; the cell's env
    time excludes the launch, so env and generation never overlap in this one-agent-at-a-time tree."""
    script = {"root": [py("r = await launch_subagent({'o3_i1': 4})\nprint(r)"), py("finish('ok')")],
              "root/subagent-0-0": [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))"), py("finish('made')")]}
    gen = ScriptedGenerator(tok, script, latency_s=0.3)
    trace = Trace()
    t0 = time.monotonic()
    with tracing(trace):  # the active trace: TreeRun picks it up without being given one
        tree = asyncio.run(run_tree(tc_task, "textcraft", gen, tok, RuntimeSettings.for_env("textcraft")))
    t1 = time.monotonic()
    assert tree.root.finish_message == "ok" and tree.nodes["root/subagent-0-0"].finish_message == "made"
    times, iv = phase_times(trace, t0, t1), phase_intervals(trace, t0, t1)
    assert len(trace.intervals("generate")) == 4 and len(trace.intervals("launch")) == 1
    assert times["generation_s"] == pytest.approx(times["generation_busy_s"]) and times["generation_s"] >= 4 * 0.3
    raw_cell = trace.spans("env_start", "env_end", node="root", turn=0)[0]
    assert raw_cell[1] - raw_cell[0] >= 2 * 0.3  # the cell itself did wait for the child's two turns
    gen_u, env_u = union(iv["generation"]), union(iv["env"])
    assert all(b <= c or d <= a for a, b in env_u for c, d in gen_u), (env_u, gen_u)
    assert times["env_busy_s"] < times["generation_s"]
    assert times["generation_s"] + times["env_s"] + times["uncovered_s"] == pytest.approx(t1 - t0)


def test_slow_world_steps_land_in_env_with_union_below_busy(tw_task, tok):
    """Two trees, each on its own worker, take two 0.5 s world steps at the same time: env busy time is about twice
    the env wall time, and generation (20 ms turns) stays small."""
    delay = 0.5
    script = {"root": ["<action>look around</action>"] * 2}

    async def main():
        factories = {**RUNTIME_FACTORIES, "textworld_sync": "tests.agents.slow_world:make_slow_world"}
        pool = await WorkerPool(2, factories=factories).start()
        try:
            gen = ScriptedGenerator(tok, script, latency_s=0.02)
            s = dataclasses.replace(RuntimeSettings.for_env("textworld_sync"), max_steps=2)
            t0 = time.monotonic()
            trees = await asyncio.gather(*(run_tree(tw_task, "textworld_sync", gen, tok, s, pool=pool,
                                                    tree_id=f"t{i}") for i in range(2)))
            return trees, t0, time.monotonic()
        finally:
            await pool.close()

    trace = Trace()
    with tracing(trace):
        trees, t0, t1 = asyncio.run(main())
    assert all(len(t.root.turns) == 2 for t in trees)
    times = phase_times(trace, t0, t1)
    assert times["env_busy_s"] >= 4 * delay * 0.9 and times["env_s"] >= 2 * delay * 0.9
    assert times["env_busy_s"] >= 1.5 * times["env_s"]  # the two trees' steps overlapped
    assert times["generation_s"] < 0.5 * times["env_s"] and times["scoring_busy_s"] == 0.0


def test_side_calls_and_judge_requests_are_spans_and_judge_tokens_reach_step_metrics(tw_task, tok):
    """A TextWorld rubric-generation tree with a frozen-policy judge: 8 judge labels (one branch needs 3 requests),
    one rubric call (generation) and 8 score calls (scoring) are spans; the judge's tokens are summed per step."""
    judge_gen = ScriptedGenerator(tok, lambda info, ids: "cannot tell" if "#b7" in info.node_id
                                  else '{"success": true, "reason": "r"}')
    judge = PolicyJudge(judge_gen, tok)

    def script(info, ids):
        name = info.node_id
        if name.startswith("rubric:"):
            return rubric_text()
        if name.startswith("score:"):
            return score_text(0.5)
        if name == "root":
            return TW_ROOT[info.turn]
        return ["<action>look around</action>", "<finish>done</finish>"][info.turn]

    factory = make_launcher_factory("rubric_generation", method_config("SERA"), "textworld_sync", judge=judge)

    async def main():
        gen = ScriptedGenerator(tok, script)
        t0 = time.monotonic()
        trees = await run_trees([tw_task], "textworld_sync", gen, tok, RuntimeSettings.for_env("textworld_sync"),
                                launcher_factory=factory)
        return await factory.finalize(trees), t0, time.monotonic()

    trace = Trace()
    with tracing(trace):
        trees, t0, t1 = asyncio.run(main())
    assert trees[0].fork_groups[0].rubric is not None
    assert len(trace.intervals("judge")) == 7 + 3 and len(judge_gen.calls) == 10
    assert len(trace.intervals("rubric")) == 1 and len(trace.intervals("score")) == 8
    times = phase_times(trace, t0, t1)
    assert times["scoring_busy_s"] > 0 and times["scoring_s"] <= t1 - t0
    m = tree_metrics(trees, env="textworld_sync")
    assert m["supervision/judge_calls"] == 10 and m["supervision/judge_labels"] == 7
    assert m["supervision/judge_prompt_tokens"] == sum(c[3] for c in judge_gen.calls)
    per_reply = {'{"success": true, "reason": "r"}': 7, "cannot tell": 3}
    assert m["supervision/judge_completion_tokens"] == sum(n * (len(tok.encode(r)) + 1) for r, n in per_reply.items())
    assert m["supervision/judge_unmetered_calls"] == 0
