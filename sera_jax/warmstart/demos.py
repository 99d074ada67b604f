"""Oracle demonstrations for the warm start: the oracle plays tasks through the real runtime, and what the engine
would have seen (each agent turn, rubric call and score call, as token streams) becomes supervised datums.

Kept: agents that played the gold plan (succeeded, or failed only through a sabotaged descendant), every rubric and
every score (the oracle's scores are the true outcomes, sabotaged children included), plus first-turn goal-copy
datums. ``warmstart/sft.py`` trains on them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

import numpy as np

from envs_py.textcraft import recipe_book
from envs_py.textcraft.tasks import goal_text
from envs_py.textcraft.world import CONTEXT_SEP
from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.records import TreeIndex, Turn
from sera_jax.agents.runtime import run_trees, start_pool
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.textcraft import task_string
from sera_jax.agents.textcraft_prompt import system_prompt, task_message
from sera_jax.agents.truncation import build_prompt
from sera_jax.assembly.settings import runtime_settings
from sera_jax.rl.datums import Datum, merge_turns
from sera_jax.rl.rewards import env_success
from sera_jax.warmstart.oracle import TextCraftOracle

CALL_PREFIXES = ("rubric:", "score:", "judge:")  # side calls (the judge's: TextWorld's policy_frozen requests)
# Bumped whenever the oracle or the choice of demonstrations changes what a recipe builds (2: agents failed only by a
# sabotaged descendant are demos too; 3: the choice to delegate depends on the depth only through the launch context
# a parent gives children at the depth limit; 4: the first cell prints the craftable ingredients the choice rests on).
DEMO_VERSION = 4


class RecordingGenerator(ScriptedGenerator):
    """A ScriptedGenerator that keeps (TurnInfo, prompt ids, completion ids) of every call."""

    def __init__(self, tokenizer: Any, script: Any):
        super().__init__(tokenizer, script)
        self.records: list[tuple[Any, list[int], list[int]]] = []

    async def generate(self, prompt_ids, params, key=None):
        result = await super().generate(prompt_ids, params, key)
        self.records.append((CURRENT_TURN.get(), list(prompt_ids), list(result.token_ids)))
        return result


def _turn(index: int, prompt: list[int], completion: list[int]) -> Turn:
    return Turn(index=index, prompt_ids=prompt, completion_ids=completion, logprobs=[0.0] * len(completion),
                policy_version=0, completion_id=None)


def demo_datums(records: Sequence[tuple[Any, list[int], list[int]]], trees: Sequence[Any],
                sabotaged: set[tuple[str, str]], *, shared_world: bool = False) -> tuple[list[Datum], dict[str, int]]:
    """Returns (SFT datums, counts): prefix-merged turns of every agent that played the gold plan — it succeeded, or
    it failed only because a sabotaged descendant did (its own replies are the same either way; dropping them would
    teach that delegating is rare) — and was not sabotaged itself, plus every rubric, score and judge call; each
    datum trains its completion tokens with advantage 1. ``shared_world`` (TextWorld): an agent's own label is the
    whole world's state when it ended (a sub-agent that ate its dish ends before the world is solved), so an agent
    counts as succeeding when its tree's root did."""

    gold = {}
    for t in trees:
        parent, failed_by_sabotage = TreeIndex.build(t).parent, set()
        for node_id in t.nodes:
            cur = node_id if (t.id, node_id) in sabotaged else None
            while cur is not None:  # a sabotaged node and its ancestors
                failed_by_sabotage.add(cur)
                cur = parent[cur]
        for n in t.nodes.values():
            label = t.nodes[t.root_id] if shared_world else n
            ok = label.env_labels.get("success", 0.0) == 1.0 or n.id in failed_by_sabotage
            gold[(t.id, n.id)] = ok and not n.rollout_error_zero_reward
    by_agent: dict[tuple[str, str], list[Turn]] = {}
    calls: list[tuple[str, Turn]] = []
    for info, prompt, completion in records:
        if info is None:
            continue
        if info.node_id.startswith(CALL_PREFIXES):
            calls.append((info.node_id.split(":", 1)[0], _turn(0, prompt, completion)))
        else:
            turns = by_agent.setdefault((info.tree_id, info.node_id), [])
            turns.append(_turn(len(turns), prompt, completion))
    datums: list[Datum] = []
    counts = {"agents": len(by_agent), "agents_kept": 0, "rubric_calls": 0, "score_calls": 0, "judge_calls": 0}

    def add(seqs, objective: str, tree_id: str, node_id: str) -> None:
        for tokens, mask, logprobs, versions in seqs:
            datums.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs),
                                versions=tuple(versions), reward=1.0, advantage=1.0, objective=objective,
                                traj_depth=0, traj_start=0, tree_id=tree_id, node_id=node_id))

    for (tree_id, node_id), turns in by_agent.items():
        if gold.get((tree_id, node_id)) and (tree_id, node_id) not in sabotaged:
            counts["agents_kept"] += 1
            add(merge_turns(turns), "execution", tree_id, node_id)
    for kind, turn in calls:
        counts[f"{kind}_calls"] += 1
        add(merge_turns([turn]), "rubric_generation" if kind == "rubric" else "scoring", "", kind)
    return datums, counts


def first_turn_prompt(cfg: Any, tokenizer: Any, goal: str) -> list[int]:
    """Returns the prompt ids of a TextCraft agent's first turn for ``goal`` (no context), as the runtime sends it."""
    style = cfg.env.prompt_style
    messages = [{"role": "system", "content": system_prompt(style)},
                {"role": "user", "content": task_message(task_string(goal, cfg.env.max_steps), style)}]
    return list(build_prompt(tokenizer, messages, cfg.rollout.max_prompt_tokens).ids)


def goal_copy_datums(cfg: Any, tokenizer: Any, tasks: Sequence[Any], oracle: Any, n: int,
                     seed: int) -> list[Datum]:
    """Returns ``n`` first-turn datums (the agent's opening prompt, exactly as ``CodeActEpisode.start`` builds it
    and ``build_prompt`` encodes it, and the oracle's first reply): the goal-copying turn, the one a small model
    finds hardest, for roots (the task's goal) and sub-agents (a craftable ingredient of a task's target in an
    amount of 1-6), over the given tasks' items."""

    rng = random.Random(seed)
    out: list[Datum] = []
    while len(out) < n:
        task = tasks[rng.randrange(len(tasks))]
        targets = dict(task.payload.get("target_items") or {})
        goal, depth = task.goal, 0
        item = next(iter(targets), None)
        r = oracle.book.recipe(item) if item else None
        sub = [k for k in r.ingredients if oracle.book.can_craft(k)] if r is not None else []
        if sub and rng.random() < 0.5:
            targets = {rng.choice(sub): rng.randint(1, 6)}
            goal, depth = goal_text(targets), 1
            context = oracle.child_context(depth)
            if context:  # as the world writes a launch's context into the child's goal
                goal += CONTEXT_SEP + context
        prompt = first_turn_prompt(cfg, tokenizer, goal)
        reply_ids = list(tokenizer.encode(oracle.plan(targets, depth, ("copy", str(len(out))))[0]))
        completion = reply_ids[:next((i + 1 for i in range(len(reply_ids))
                                      if "</python>" in tokenizer.decode(reply_ids[:i + 1])), len(reply_ids))]
        (tokens, mask, logprobs, versions), = merge_turns([_turn(0, list(prompt), completion)])
        out.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs), versions=tuple(versions),
                         reward=1.0, advantage=1.0, objective="execution", traj_depth=depth, traj_start=0,
                         node_id="copy"))
    return out


async def collect_demos(cfg: Any, tokenizer: Any, tasks: Sequence[Any]) -> tuple[list[Datum], dict[str, Any]]:
    """Runs the oracle on ``tasks`` through the runtime (execution-stage SERA launcher); returns (datums, stats)."""
    ws = cfg.warmstart
    world = tasks[0].payload.get("world") or {}
    book = recipe_book(int(world.get("seed", 42)), int(world.get("items_per_domain_tier", 25)))
    oracle = TextCraftOracle(book, tokenizer, max_depth=cfg.env.max_depth, delegate_prob=ws.delegate_prob,
                             fail_prob=ws.fail_prob, exhaust_share=ws.exhaust_share,
                             rubric_target_prob=ws.rubric_target_prob, rubric_miss=ws.rubric_miss, seed=ws.seed)
    gen = RecordingGenerator(tokenizer, oracle)
    settings = dataclasses.replace(runtime_settings(cfg), deterministic=False)
    method = cfg.method_config()
    # The first ``fork_demo_tasks`` tasks are played as in the rubric-generation stage (fork groups of
    # ``method.branching_factor`` branches, then the post-hoc rubric, whose prompt shows the parent's whole reply,
    # and the branch scores); the others as in the execution stage (a rubric before, a score after every child).
    split = min(ws.fork_demo_tasks, len(tasks))
    plays = [(stage, part) for stage, part in (("rubric_generation", list(tasks[:split])),
                                               ("execution", list(tasks[split:]))) if part]
    trees = []
    pool = await start_pool(cfg.env.num_workers)
    try:
        for stage, part in plays:
            # Side calls cut to the engine's context as in training (run.py), so a long child's scoring prompt
            # is the one the policy will see.
            factory = make_launcher_factory(stage, method, cfg.env.name, max_context=settings.max_context)
            done = await run_trees(part, cfg.env.name, gen, tokenizer, settings, pool=pool, max_concurrent=16,
                                   launcher_factory=factory)
            trees += await factory.finalize(done)
    finally:
        await pool.close()
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged)
    sabotaged = len(oracle.sabotaged)
    if ws.copy_demos:
        datums += goal_copy_datums(cfg, tokenizer, tasks, oracle, ws.copy_demos, ws.seed)
    roots = [t.nodes[t.root_id] for t in trees]
    stats = {"demo_trees": len(trees), "fork_demo_trees": split, "fork_groups": sum(len(t.fork_groups) for t in trees),
             "oracle_root_success": float(np.mean([env_success(r) for r in roots])),
             "delegations": sum(bool(d.child_ids) for t in trees for d in t.delegations),
             "refused_launches": sum(not d.child_ids for t in trees for d in t.delegations),
             "sabotaged_children": sabotaged,
             "rubrics_naming_the_target": oracle.rubrics["target"],
             "rubrics_naming_a_distractor": oracle.rubrics["distractor"],
             "vague_rubrics": oracle.rubrics["vague"] + oracle.rubrics["generic"],
             "goal_copy_datums": ws.copy_demos,
             "datums": len(datums), "trained_tokens": sum(d.num_trained for d in datums), **counts}
    return datums, stats
