"""The tiny TextWorld tokenizer (``builtin:textworld``): a small sentencepiece model trained on the text a
TextWorld-Sync agent sees and writes in the compact style.

The corpus is what the policy meets: compact system prompts and first messages, the observations and valid actions
along the oracle's single-agent and split solutions (``envs_py.textworld_sync.solver``) of generated tasks of every
family and difficulty and of the official sample, the oracle's replies (actions,
delegations with their goals, finish messages), rubric, scoring and judge requests and replies, the sub-agent results
block and the protocol's error texts. Pieces may span spaces, so each of the 22 ingredient names is one piece
(``" block of cheese"``), the same in the task, the observation and a delegated goal, and an action at the start of
a line (``take white onion``) is the same pieces in the valid-action list and in an action block: copying is
copying tokens, and prompts take ~25% fewer tokens than with pieces cut at spaces. Built deterministically
(sorted corpus, single-threaded trainer). The package ships the result (``assets/textworld_tiny.model``, 1,024
pieces; ``python -m sera_jax.warmstart.textworld_tokenizer sera_jax/assets/textworld_tiny.model`` regenerates it,
and a test checks that a rebuild gives the same pieces).
"""

from __future__ import annotations

import json
from pathlib import Path

from envs_py.textworld_sync import generate_tasks, load_tasks, make_world
from envs_py.textworld_sync import messages as M
from envs_py.textworld_sync.protocol import parse_reply
from envs_py.textworld_sync.solver import next_action, split_assignment
from envs_py.textworld_sync.world import ROOT
from sera_jax.agents import judge as J
from sera_jax.agents import rubric as Rb
from sera_jax.agents import textworld_prompt as P
from sera_jax.agents.environments.textworld import TEXTWORLD
from sera_jax.assembly.tokenizer import BUILTIN
from sera_jax.warmstart.textworld_oracle import (
    dish_specs,
    finish_text,
    goal_text,
    judge_text,
    rubric_text,
    score_text,
)
from sera_jax.warmstart.tokenizer import train_tiny_model

VOCAB_SIZE = 1024


def _episode(world, assignment: dict[str, list[int]], texts: list[str]) -> None:
    """Plays the oracle round-robin on ``world`` and appends every acting agent's compact feedback text."""
    for agent in assignment:
        world.add_agent(agent)
    agents, idle = list(assignment), 0
    while world.steps < world.limit and not world.success() and idle < len(agents):
        agent = agents[world.steps % len(agents)]
        action = next_action(world, agent, set(assignment[agent]))
        if action is None:
            idle += 1
            world.step(agent, "look around")  # nobody can act (a tool cools down): time passes
            continue
        idle = 0
        obs, infos = world.observe_full(agent)
        texts.append(P.compact_feedback(obs, list(infos["validActions"])))
        texts.append(f"<action>{action}</action>")
        world.step(agent, action)


def _task_texts(task, texts: list[str]) -> None:
    world = make_world(task)
    obs = world.reset()
    valid = world.valid_actions(ROOT)
    texts += [task.goal, *task.generation_properties.get("task_descriptions", {}).values(),
              P.compact_task_message(task.goal, obs, valid)]
    specs = dish_specs(task.goal)
    goals = [goal_text(d, s) for d, s in specs]
    delegate = f"<delegate>{json.dumps({'delegations': [{'goal': g} for g in goals]})}</delegate>"
    texts.append(delegate)
    for g, (d, _) in zip(goals, specs):
        texts += [g, P.compact_task_message(g, obs, valid), rubric_text(g), finish_text([d])]
        ctx = Rb.RubricContext(parent_goal=task.goal, metadata={}, parent_messages=[], parent_action=delegate,
                               environment_state={}, child_goal=g)
        texts += [m["content"] for m in Rb.compact_rubric_request(ctx)]
    n = len(world.c.dish_ids)
    _episode(make_world(task), {ROOT: list(range(n))}, texts)
    split = make_world(task)
    split.reset()
    assignment = {a: [world.c.dish_ids.index(d) for d in ds]
                  for a, ds in split_assignment(list(world.c.dish_ids), n).items()}
    _episode(split, assignment, texts)
    final = split.get_object_tree()
    for agent, ds in assignment.items():
        dish = world.c.dish_ids[ds[0]]
        goal = goal_text(dish, dict(specs).get(dish, ""))
        rubric = json.loads(rubric_text(goal))
        view = {"steps": [{"code": "<action>look around</action>"}], "finish_message": finish_text([dish])}
        texts += [m["content"] for m in Rb.compact_textworld_score_request(rubric, goal, view, final)]
        obs_final, _ = split.observe_full(agent)
        texts.append(M.subagent_results_text([{"agent_id": agent, "returned_to_parent": True,
                                               "environment_success": True, "steps": 8, "max_steps": 16,
                                               "finish_message": f"Prepared and ate {dish}.",
                                               "final_observation": obs_final}], obs_final))
        texts += [f"[Goal]\n{goal}\n\n[Final State]\n{J.dish_progress(obs_final)}", judge_text(True, [dish]),
                  judge_text(False, [dish])]


def corpus(num_per_cell: int = 2) -> list[str]:
    """Returns the tokenizer's training texts, sorted and without duplicates (see the module docstring)."""
    texts = [P.compact_system_prompt(True), P.compact_system_prompt(False), Rb.COMPACT_RUBRIC_SYSTEM,
             Rb.COMPACT_RUBRIC_FORMAT, Rb.COMPACT_SCORE_SYSTEM, J.COMPACT_JUDGE_SYSTEM, score_text(True),
             score_text(False), M.inventory_lookup_text("white onion", "You are in the kitchen."),
             M.depth_rejection_text(1, "You are in the kitchen.", 1)]
    for bad in ("take salt", "<action>a</action><finish>b</finish>", '<delegate>{"goal": 1}</delegate>'):
        texts.append(M.invalid_reply_text(parse_reply(bad).error, "You are in the kitchen."))
    tasks = generate_tasks("test", base_seed=600000, per_cell=num_per_cell) + load_tasks("sample")
    for task in tasks:
        _task_texts(task, texts)
    return sorted(set(texts))


def build_textworld_tokenizer(path: str | Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Trains (once) the tiny TextWorld sentencepiece model at ``path``; returns the path of the ``.model``."""
    return train_tiny_model(path, corpus, vocab_size)


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else BUILTIN[TEXTWORLD.tokenizer.name])
    out.unlink(missing_ok=True)
    print(build_textworld_tokenizer(out))
    out.with_suffix(".vocab").unlink(missing_ok=True)  # sentencepiece's human-readable listing; not needed
