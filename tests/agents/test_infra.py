"""Infrastructure failures (issue #48): a tree whose env worker is SIGKILLed mid-rollout is marked as such (its
reason recorded, the zero reward kept on the record) and left out of credit; a failure the policy's side causes (its
generator raising) is not marked."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

from sera_jax.agents import infra
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.rewards import env_success
from sera_jax.rl.stages import method_config
from sera_jax.training.loop import Loop
from sera_jax.training.stats import tree_metrics

QUICK = "<thought>look</thought>\n<python>print(get_info(['stick']))</python>"


def test_a_killed_env_worker_marks_its_tree_and_credit_leaves_it_out(tc_task, tok):
    settings = dataclasses.replace(RuntimeSettings.for_env("textcraft"), max_steps=3)

    async def main():
        pool = await start_pool(1)
        try:
            def doomed_script(info, prompt_ids):
                if info.turn == 1:  # the worker dies as the second action is sent
                    os.kill(pool.workers[0].proc.pid, signal.SIGKILL)
                return QUICK

            doomed = await run_tree(tc_task, "textcraft", ScriptedGenerator(tok, doomed_script), tok, settings,
                                    pool=pool, tree_id="doomed", rollout_index=0)
            ok = [await run_tree(tc_task, "textcraft", ScriptedGenerator(tok, {"root": [QUICK] * 3}), tok, settings,
                                 pool=pool, tree_id=f"ok{i}", rollout_index=i) for i in (1, 2)]

            def engine_fails(info, prompt_ids):
                raise RuntimeError("engine fell over")

            policy_side = await run_tree(tc_task, "textcraft", ScriptedGenerator(tok, engine_fails), tok, settings,
                                         pool=pool, tree_id="policy", rollout_index=3)
            return doomed, ok, policy_side
        finally:
            await pool.close()

    doomed, ok, policy_side = asyncio.run(main())
    assert len(doomed.root.turns) == 1 and doomed.root.rollout_error_zero_reward and env_success(doomed.root) == 0.0
    assert infra.INFRA_KEY in doomed.misc, (doomed.root.error_message, doomed.root.misc, doomed.misc)
    assert doomed.misc[infra.INFRA_KEY].startswith(("WorkerDied", "TreeFailed"))
    assert doomed.root.misc[infra.INFRA_KEY] == doomed.misc[infra.INFRA_KEY]
    assert not any(infra.failed(t) for t in ok)
    assert policy_side.root.rollout_error_zero_reward and not infra.failed(policy_side)  # the reference's zero
    assert tree_metrics([doomed, *ok, policy_side])["infra_failed_trees"] == 1.0

    method = method_config("sera")
    loop = Loop(state=None, step_fn=None, publish=None, run_group=None, tasks=[], method=method, stream=None,
                env="textcraft", decode=tok.decode, mesh=None, filter_zero_variance=False)
    with_dead = task_group_credit("execution", [doomed, *ok], method, env="textcraft", filter_zero_variance=False)
    credited = loop._credit("execution", [doomed, *ok])
    without = task_group_credit("execution", ok, method, env="textcraft", filter_zero_variance=False)
    assert credited.accepted and [d.advantage for d in credited.datums] == [d.advantage for d in without.datums]
    assert len(without.datums) < len(with_dead.datums)  # the dead tree's first turn would have trained
    assert not loop._credit("execution", [doomed]).accepted  # nothing of the policy's left: a replacement group
