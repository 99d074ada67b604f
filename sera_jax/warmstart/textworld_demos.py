"""TextWorld-Sync oracle demonstrations for the warm start: ``TextWorldOracle`` plays tasks through the real runtime
(the shared world, concurrent sub-agents, the run's launchers and its ``policy_frozen`` judge's requests), and what
the engine would have seen becomes supervised datums — the twin of ``demos.collect_demos`` for TextCraft.

Played like training: the first ``warmstart.fork_demo_tasks`` tasks as in the rubric-generation stage (the first
child of a delegation forked into ``method.branching_factor`` branches on copies of the world, then the post-hoc
rubric and the branch scores, then the judge's label of each branch of a group with a valid rubric), the others as
in the execution stage (a rubric before every child, a score after it, then the judge's label of every sub-agent —
the labels the RAO family is rewarded by). Kept (``demos.demo_datums``): the turns of every agent that played the
oracle's rule and was not sabotaged, every rubric, score and judge call (the oracle's scores and labels are the true
outcomes, sabotaged children's 0 included), each score and judge call again with its final state flipped to the
other verdict (``verdict_flip_datums``), plus first-turn datums (``first_turn_datums``) on the tasks of
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
from sera_jax.agents.textworld_prompt import compact_feedback, compact_system_prompt, compact_task_message
from sera_jax.agents.truncation import build_prompt, continue_prompt
from sera_jax.assembly.judge import judge_settings
from sera_jax.assembly.settings import runtime_settings
from sera_jax.rl.datums import Datum, merge_turns
from sera_jax.rl.rewards import env_success
from sera_jax.warmstart.demos import RecordingGenerator, demo_datums
from sera_jax.warmstart.textworld_oracle import TextWorldOracle, dish_specs, flip_final_state, goal_text, next_action

ENV = "textworld_sync"
# Bumped whenever the oracle or the choice of demonstrations changes what a TextWorld recipe builds.
TEXTWORLD_DEMO_VERSION = 4  # 3: the verdict-flip demos (``verdict_flip_datums``); 4: their siblings' dishes flipped


def _judge(cfg: Any, generator: Any, tokenizer: Any) -> SubagentJudge:
    """Returns the judge the demos ask, answered by the recording oracle: the run's ``policy_frozen`` settings (its
    prompt style and caps), so the judge requests the policy learns are the ones it will be sent."""
    settings = judge_settings(cfg, kind="policy_frozen")
    return SubagentJudge(make_judge(ENV, settings, generator=generator, tokenizer=tokenizer),
                         concurrency=cfg.judge.concurrency)


def _first_messages(cfg: Any, text: str, depth: int, observation: str, valid: list[str]) -> list[dict]:
    """Returns the messages of a compact TextWorld agent's first turn, as ``TextWorldEpisode.start`` builds them."""
    can_delegate = depth < cfg.env.max_depth
    return [{"role": "system", "content": compact_system_prompt(can_delegate)},
            {"role": "user", "content": compact_task_message(text, observation, valid)}]


def _first_prompt(cfg: Any, tokenizer: Any, text: str, depth: int, observation: str, valid: list[str]) -> list[int]:
    """Returns the prompt ids of a compact TextWorld agent's first turn, as ``TextWorldEpisode.start`` builds it."""
    messages = _first_messages(cfg, text, depth, observation, valid)
    return list(build_prompt(tokenizer, messages, cfg.rollout.max_prompt_tokens).ids)


def _turn(prompt: Sequence[int], reply: str, tokenizer: Any, index: int) -> Turn:
    completion = list(tokenizer.encode(reply)) + [tokenizer.im_end_id]  # as the engine ends a reply
    return Turn(index=index, prompt_ids=list(prompt), completion_ids=completion, logprobs=[0.0] * len(completion),
                policy_version=0, completion_id=None)


def _sub_agent_turns(cfg: Any, tokenizer: Any, oracle: TextWorldOracle, world: Any, goal: str,
                     key: str) -> list[Turn]:
    """Returns a sub-agent's first turn on ``world`` as it stands (the root's view: a sub-agent starts where its parent
    is) and, when that turn acted, its second, whose prompt continues the first as the runtime's does: the reply's
    tokens, then that action's observation and the valid actions after it."""
    observation, infos = world.observe_full(ROOT)
    messages = _first_messages(cfg, goal, 1, observation, list(infos["validActions"]))
    first = build_prompt(tokenizer, messages, cfg.rollout.max_prompt_tokens)
    reply = oracle.agent_reply(tokenizer.decode(list(first.ids)), key, f"{ROOT}/first", 1, -1)
    turns = [_turn(first.ids, reply, tokenizer, 0)]
    command = reply[len("<action>"):-len("</action>")] if reply.startswith("<action>") else None
    if command is None or world.success():
        return turns
    after = world.step(ROOT, command).observation
    _, infos = world.observe_full(ROOT)
    messages += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": compact_feedback(after, list(infos["validActions"]))}]
    second = continue_prompt(tokenizer, first, turns[0].completion_ids, messages, cfg.rollout.max_prompt_tokens)
    if second is None or world.success():
        return turns
    reply2 = oracle.agent_reply(tokenizer.decode(list(second.ids)), key, f"{ROOT}/first", 1, -1)
    return turns + [_turn(second.ids, reply2, tokenizer, 1)]


def _play_rule(world, limit: int) -> int:
    """Plays the oracle rule's solo solution on ``world`` as the root for at most ``limit`` actions, stopping before
    the world is solved; returns the number of actions taken."""
    taken = 0
    while taken < limit and not world.success():
        observation, infos = world.observe_full(ROOT)
        world.step(ROOT, next_action(list(infos["validActions"]), observation))
        taken += 1
    return taken


def first_turn_datums(cfg: Any, tokenizer: Any, tasks: Sequence[Any], oracle: TextWorldOracle, n: int,
                      seed: int) -> list[Datum]:
    """Returns ``n`` first-turn datums of the tasks: half are roots on a fresh world (the oracle's own choice: a
    delegation copying every dish into a goal, ``delegate_prob`` of the time, else its first action; a closed gate
    opened first), half are sub-agents given one dish's goal on a world the oracle's rule has played for a random
    number of steps (a sub-agent starts where and when its parent is; its reply is the rule's next action, or its
    finish once its dish is eaten), followed by its second turn (the first one's action taken, its feedback, the
    next reply), so the action is read off the end of the valid-action list both before the task text (a first
    message) and at the end of the prompt (every later one). Turning a task into a delegation, and reading the
    action off the valid-action list, are what a small model is slowest to learn; these are cheap (a turn or two)."""
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
            turns, depth = [_turn(prompt, reply, tokenizer, 0)], 0
        else:
            fresh = make_world(task, cfg.env.rules)
            fresh.reset()
            played = _play_rule(fresh, 40)                    # the length of the rule's whole solo play, then
            _play_rule(world, rng.randrange(max(played, 1)))  # a random part of it on this (fresh) world
            dish, spec = specs[rng.randrange(len(specs))]
            turns, depth = _sub_agent_turns(cfg, tokenizer, oracle, world, goal_text(dish, spec), f"first{len(out)}"), 1
        (tokens, mask, logprobs, versions), = merge_turns(turns)
        out.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs), versions=tuple(versions),
                         reward=1.0, advantage=1.0, objective="execution", traj_depth=depth, traj_start=0,
                         node_id="first"))
    return out


def verdict_flip_datums(records: Sequence[tuple[Any, list[int], list[int]]], tokenizer: Any, oracle: TextWorldOracle,
                        seed: int) -> list[Datum]:
    """Returns one datum per score and judge call of ``records`` (the recording generator's): the same prompt with
    its final state rewritten to the other verdict (``textworld_oracle.flip_final_state``) and the oracle's reply to
    it. Paired with the call's own datum, the two differ only in the final state's dish lines, so the scorer and the
    judge learn to read the state, not the trajectory's look (see ``flip_final_state``)."""
    rng = random.Random(seed)
    out: list[Datum] = []
    for info, prompt, _ in records:
        kind = info.node_id.split(":", 1)[0] if info is not None and ":" in info.node_id else ""
        if kind not in ("score", "judge"):
            continue
        text = flip_final_state(tokenizer.decode(list(prompt)), rng)
        if text is None:
            continue
        turn = _turn(tokenizer.encode(text), oracle.side_call(kind, text), tokenizer, 0)
        (tokens, mask, logprobs, versions), = merge_turns([turn])
        out.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs), versions=tuple(versions),
                         reward=1.0, advantage=1.0, objective="scoring", traj_depth=0, traj_start=0,
                         node_id=f"{kind}-flip"))
    return out


def recipe_play(cfg: Any) -> dict[str, Any]:
    """Returns what else shapes TextWorld's demos, for the warm-start recipe: world rules, fork groups, side-call
    caps."""
    m, j = cfg.method_config(), cfg.judge
    return {"rules": cfg.env.rules, "branching_factor": m.branching_factor,
            "max_counterfactual_envs_per_rollout": m.max_counterfactual_envs_per_rollout,
            "max_rubric_tokens": m.max_rubric_tokens, "max_scoring_tokens": m.max_scoring_tokens,
            "rubric_stage_max_scoring_tokens": m.rubric_stage_max_scoring_tokens, "judge_max_tokens": j.max_tokens}


async def collect_textworld_demos(cfg: Any, tokenizer: Any, tasks: Sequence[Any]) -> tuple[list[Datum], dict]:
    """Runs the oracle on ``tasks`` through the runtime (see the module docstring); returns (datums, stats)."""
    ws = cfg.warmstart
    oracle = TextWorldOracle(tokenizer, delegate_prob=ws.delegate_prob, fail_prob=ws.fail_prob, seed=ws.seed,
                             child_rule=ws.child_rule)
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
    flips = verdict_flip_datums(gen.records, tokenizer, oracle, ws.seed)
    datums += flips
    if ws.copy_demos:
        copy_tasks = load_task_set(ws.copy_task_set)[0] if ws.copy_task_set else tasks
        datums += first_turn_datums(cfg, tokenizer, copy_tasks, oracle, ws.copy_demos, ws.seed)
    roots = [t.nodes[t.root_id] for t in trees]
    stats = {"demo_trees": len(trees), "fork_demo_trees": split, "fork_groups": sum(len(t.fork_groups) for t in trees),
             "ranked_fork_groups": sum(1 for t in trees for g in t.fork_groups
                                       if len({b.success for b in g.branches if b.success is not None}) == 2),
             "oracle_root_success": float(np.mean([env_success(r) for r in roots])) if roots else 0.0,
             "delegations": sum(bool(d.child_ids) for t in trees for d in t.delegations),
             "sabotaged_children": len(oracle.sabotaged),
             "judge_labels": {k: v.get("labelled", 0) for k, v in labels.items()},
             "verdict_flip_datums": len(flips), "first_turn_datums": ws.copy_demos, "first_turn_tasks": len(copy_tasks) if ws.copy_demos else 0,
             "datums": len(datums),
             "trained_tokens": sum(d.num_trained for d in datums), **counts}
    return datums, stats
