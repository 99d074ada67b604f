"""TextWorld-Sync oracle demonstrations for the warm start: ``TextWorldOracle`` plays tasks through the real runtime
(the shared world, concurrent sub-agents, the run's launchers and its ``policy_frozen`` judge's requests), and what
the engine would have seen becomes supervised datums — the twin of ``demos.collect_demos`` for TextCraft.

Played like training: the first ``warmstart.fork_demo_tasks`` tasks as in the rubric-generation stage (the first
child of a delegation forked into ``method.branching_factor`` branches on copies of the world, then the post-hoc
rubric and the branch scores, then the judge's label of each branch of a group with a valid rubric), the others as
in the execution stage (a rubric before every child, a score after it, then the judge's label of every sub-agent —
the labels the RAO family is rewarded by). Kept (``demos.demo_datums``): the turns of every agent that played the
oracle's plan and was not sabotaged, every rubric, score and judge call (the oracle's scores and labels are the true
outcomes, sabotaged children's 0 included), plus first-turn datums (``first_turn_datums``) on the tasks of
``warmstart.copy_task_set`` (else the demo tasks).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

import numpy as np

from envs_py.textworld_sync import make_world
from envs_py.textworld_sync.task_sets import load_task_set
from envs_py.textworld_sync.world import ROOT
from sera_jax.agents.judge import make_judge
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.records import Turn
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.subagent_judge import DeferredJudge, SubagentJudge
from sera_jax.agents.textworld_prompt import compact_system_prompt, compact_task_message
from sera_jax.agents.truncation import build_prompt
from sera_jax.assembly.judge import judge_settings
from sera_jax.assembly.settings import runtime_settings
from sera_jax.rl.datums import Datum, merge_turns
from sera_jax.warmstart.demos import RecordingGenerator, demo_datums
from sera_jax.warmstart.textworld_oracle import TextWorldOracle, dish_specs, goal_text, plan, plan_reply

ENV = "textworld_sync"
# Bumped whenever the oracle or the choice of demonstrations changes what a TextWorld recipe builds.
TEXTWORLD_DEMO_VERSION = 1


def _judge(cfg: Any, generator: Any, tokenizer: Any) -> SubagentJudge:
    """Returns the judge the demos ask, answered by the recording oracle: the run's ``policy_frozen`` settings (its
    prompt style and caps), so the judge requests the policy learns are the ones it will be sent."""
    settings = judge_settings(dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, kind="policy_frozen")))
    return SubagentJudge(make_judge(ENV, settings, generator=generator, tokenizer=tokenizer),
                         concurrency=cfg.judge.concurrency)


def _first_prompt(cfg: Any, tokenizer: Any, text: str, depth: int, observation: str, valid: list[str]) -> list[int]:
    """Returns the prompt ids of a compact TextWorld agent's first turn, as ``TextWorldEpisode.start`` builds it."""
    can_delegate = depth < cfg.env.max_depth
    messages = [{"role": "system", "content": compact_system_prompt(can_delegate)},
                {"role": "user", "content": compact_task_message(text, observation, valid)}]
    return list(build_prompt(tokenizer, messages, cfg.rollout.max_prompt_tokens).ids)


def first_turn_datums(cfg: Any, tokenizer: Any, tasks: Sequence[Any], oracle: TextWorldOracle, n: int,
                      seed: int) -> list[Datum]:
    """Returns ``n`` first-turn datums on fresh worlds of the given tasks: half are roots (the oracle's own choice:
    a delegation copying every dish into a goal, ``delegate_prob`` of the time, else its plan of every dish; a closed
    gate opened first), half are sub-agents given one dish's goal (its plan and first step). Turning a task into a
    delegation or a plan is the copying a small model is slowest to learn; these are cheap (one turn each)."""
    rng = random.Random(seed)
    out: list[Datum] = []
    while len(out) < n:
        task = tasks[rng.randrange(len(tasks))]
        world = make_world(task, cfg.env.rules)
        observation = world.reset()
        valid = world.valid_actions(ROOT)
        specs = dish_specs(task.goal)
        if rng.random() < 0.5 or not specs or cfg.env.max_depth < 1:
            prompt = _first_prompt(cfg, tokenizer, task.goal, 0, observation, valid)
            reply = oracle.agent_reply(tokenizer.decode(prompt), f"first{len(out)}", ROOT, 0, 0)
            depth = 0
        else:
            dish, spec = specs[rng.randrange(len(specs))]
            goal = goal_text(dish, spec)
            prompt = _first_prompt(cfg, tokenizer, goal, 1, observation, valid)
            reply, depth = plan_reply(plan([(dish, spec)], valid, observation)), 1
        completion = list(tokenizer.encode(reply)) + [tokenizer.im_end_id]  # as the engine ends a reply
        turn = Turn(index=0, prompt_ids=prompt, completion_ids=completion, logprobs=[0.0] * len(completion),
                    policy_version=0, completion_id=None)
        (tokens, mask, logprobs, versions), = merge_turns([turn])
        out.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs), versions=tuple(versions),
                         scalar=1.0, objective="execution", traj_depth=depth, traj_start=0, node_id="first"))
    return out


async def collect_textworld_demos(cfg: Any, tokenizer: Any, tasks: Sequence[Any]) -> tuple[list[Datum], dict]:
    """Runs the oracle on ``tasks`` through the runtime (see the module docstring); returns (datums, stats)."""
    ws = cfg.warmstart
    oracle = TextWorldOracle(tokenizer, delegate_prob=ws.delegate_prob, fail_prob=ws.fail_prob, seed=ws.seed)
    gen = RecordingGenerator(tokenizer, oracle)
    settings = dataclasses.replace(runtime_settings(cfg), deterministic=False)
    method = cfg.method_config()
    judge = _judge(cfg, gen, tokenizer)
    split = min(ws.fork_demo_tasks, len(tasks))
    trees, labels = [], {"execution": {}, "rubric_generation": {}}
    for stage, part in (("rubric_generation", list(tasks[:split])), ("execution", list(tasks[split:]))):
        if not part:
            continue
        factory = make_launcher_factory(stage, method, ENV, settings=settings,
                                        judge=DeferredJudge() if stage == "rubric_generation" else None)
        done = await run_trees(part, ENV, gen, tokenizer, settings, max_concurrent=16, launcher_factory=factory,
                               textworld_rules=cfg.env.rules)
        done = await factory.finalize(done)
        # Branches of the groups with a valid rubric (rubric stage), every sub-agent (execution): the judge
        # requests training sends the frozen policy, answered here by the oracle.
        labels[stage] = await (judge.label_fork_groups(done) if stage == "rubric_generation"
                               else judge.label_subagents(done))
        trees += done
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged, shared_world=True)
    if ws.copy_demos:
        copy_tasks = load_task_set(ws.copy_task_set)[0] if ws.copy_task_set else tasks
        datums += first_turn_datums(cfg, tokenizer, copy_tasks, oracle, ws.copy_demos, ws.seed)
    roots = [t.nodes[t.root_id] for t in trees]
    stats = {"demo_trees": len(trees), "fork_demo_trees": split, "fork_groups": sum(len(t.fork_groups) for t in trees),
             "ranked_fork_groups": sum(1 for t in trees for g in t.fork_groups
                                       if len({b.success for b in g.branches if b.success is not None}) == 2),
             "oracle_root_success": float(np.mean([r.reward or 0.0 for r in roots])) if roots else 0.0,
             "delegations": sum(bool(d.child_ids) for t in trees for d in t.delegations),
             "sabotaged_children": len(oracle.sabotaged),
             "judge_labels": {k: v.get("labelled", 0) for k, v in labels.items()},
             "first_turn_datums": ws.copy_demos, "first_turn_tasks": len(copy_tasks) if ws.copy_demos else 0,
             "datums": len(datums),
             "trained_tokens": sum(d.num_trained for d in datums), **counts}
    return datums, stats
