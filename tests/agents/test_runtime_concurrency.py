"""Many trees against one generator: slow env steps do not stall other trees, trees overlap, failures stay local."""

from __future__ import annotations

import asyncio
import dataclasses

from envs_py.workers import WorkerPool
from sera_jax.agents.envs import RUNTIME_FACTORIES
from sera_jax.agents.harness import Trace
from sera_jax.agents.runtime import Pinning, run_tree, run_trees, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.rewards import env_success

SLOW_S = 1.0


def test_slow_env_step_does_not_stall_other_trees(tw_task, tok):
    """Tree A's world steps take 1 s each in its env worker; meanwhile tree B keeps generating turn after turn."""
    script = {"root": ["<action>look around</action>"] * 40}

    async def main():
        factories = {**RUNTIME_FACTORIES, "textworld_sync": "tests.agents.slow_world:make_slow_world"}
        pool = await WorkerPool(1, factories=factories).start()
        try:
            trace = Trace()
            gen = ScriptedGenerator(tok, script, latency_s=0.05)
            s = RuntimeSettings.for_env("textworld_sync")
            slow = run_tree(tw_task, "textworld_sync", gen, tok, dataclasses.replace(s, max_steps=2),
                            pool=pool, trace=trace, tree_id="slow")
            # The fast tree outlives both slow steps (40 turns of ≥ 50 ms).
            fast = run_tree(tw_task, "textworld_sync", gen, tok, dataclasses.replace(s, max_steps=40), trace=trace,
                            tree_id="fast")
            return await asyncio.gather(slow, fast), trace
        finally:
            await pool.close()

    (slow, fast), trace = asyncio.run(main())
    assert len(slow.root.turns) == 2 and len(fast.root.turns) == 40
    env_spans = trace.spans("env_start", "env_end", tree="slow")
    assert len(env_spans) == 2 and all(t1 - t0 >= SLOW_S * 0.9 for t0, t1, _ in env_spans)
    gen_fast = trace.spans("generate_start", "generate_end", tree="fast")
    # While tree A waited on its slow world, tree B's generation went on: several whole turns fit inside.
    for t0, t1, _ in env_spans:
        inside = [g for g in gen_fast if t0 <= g[0] and g[1] <= t1]
        assert len(inside) >= 3, (t0, t1, [(g[0], g[1]) for g in gen_fast])


def test_many_trees_in_flight_share_the_generator(tc_task, tok):
    from envs_py.textcraft import load_tasks

    tasks = [tc_task, load_tasks("val")[1]]
    script = {"root": ["<thought>a</thought>\n<python>print(1)</python>",
                       "<thought>b</thought>\n<python>print(2)</python>",
                       "<thought>c</thought>\n<python>finish('stop')</python>"]}

    async def main():
        pool = await start_pool(2)
        try:
            gen = ScriptedGenerator(tok, script, latency_s=0.2)
            trees = await run_trees(tasks, "textcraft", gen, tok, RuntimeSettings.for_env("textcraft"),
                                    rollouts_per_task=3, pool=pool, max_concurrent=6)
            return trees, gen
        finally:
            await pool.close()

    trees, gen = asyncio.run(main())
    assert [t.id for t in trees] == [f"{t.task_id}#{r}" for t in tasks for r in range(3)]
    assert all(len(t.root.turns) == 3 and t.root.finish_message == "stop" for t in trees)
    # Peak number of generate calls in flight at once (the engine would batch them).
    edges = sorted([(c[0], 1) for c in gen.calls] + [(c[1], -1) for c in gen.calls])
    level = peak = 0
    for _, d in edges:
        level += d
        peak = max(peak, level)
    assert peak >= 4
    # Rollouts of one task differ only in their keys: same tokens, different behaviour logprobs.
    a, b = trees[0].root.turns[0], trees[1].root.turns[0]
    assert a.completion_ids == b.completion_ids and a.logprobs != b.logprobs


def test_pinning_partitions_trees_across_hosts(tc_task, tw_task):
    items = [(t, r) for t in (tc_task, tw_task) for r in range(8)]
    parts = [Pinning(3, h).local(items) for h in range(3)]
    assert sorted((t.task_id, r) for p in parts for t, r in p) == sorted((t.task_id, r) for t, r in items)
    assert all(parts) and sum(map(len, parts)) == len(items)


def test_dead_worker_and_failing_generator_are_recorded_not_raised(tc_task, tw_task, tok):
    async def main():
        pool = await start_pool(1)
        try:
            spin = {"root": ["<thought>spin</thought>\n<python>while True:\n    pass</python>"]}
            cell = asyncio.ensure_future(run_tree(tc_task, "textcraft", ScriptedGenerator(tok, spin), tok,
                                                  RuntimeSettings.for_env("textcraft"), pool=pool))
            while not cell.done() and not any(w is not None and w.trees for w in pool.workers):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            pool.workers[0].proc.kill()
            dead = await cell

            def script(info, prompt_ids):
                if info.turn == 1:
                    raise RuntimeError("engine fell over")
                return "<action>look around</action>"

            broken = await run_tree(tw_task, "textworld_sync", ScriptedGenerator(tok, script), tok,
                                    RuntimeSettings.for_env("textworld_sync"))

            def crash_child(info, prompt_ids):
                if info.node_id != "root":
                    raise RuntimeError("child generation failed")
                return ['<delegate>{"goal": "anything"}</delegate>', "<finish>carried on</finish>"][info.turn]

            crashed = await run_tree(tw_task, "textworld_sync", ScriptedGenerator(tok, crash_child), tok,
                                     RuntimeSettings.for_env("textworld_sync"))
            return dead, broken, crashed
        finally:
            await pool.close()

    dead, broken, crashed = asyncio.run(main())
    assert dead.root.rollout_error_zero_reward and env_success(dead.root) == 0.0
    assert dead.root.error_message.startswith("Error in episode loop at step 0: WorkerDied")
    assert broken.root.rollout_error_zero_reward and len(broken.root.turns) == 1
    assert "RuntimeError: engine fell over" in broken.root.error_message
    # A crashed child is reported to its parent, which carries on.
    assert "result: SubAgent crashed: Error in episode loop at step 0: RuntimeError: child generation failed" in \
        crashed.root.turns[0].output
    assert crashed.root.finish_message == "carried on" and not crashed.root.rollout_error_zero_reward
