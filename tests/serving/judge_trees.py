"""Finished TextWorld trees for judge tests: a root and its sub-agents, each with a dish goal, the actions it took
and a final observation whose dish progress says whether its dish was eaten (the evidence the compact judge reads);
and rubric-generation trees whose counterfactual branches of one dish wait for their deferred judge labels."""

from __future__ import annotations

import random

from sera_jax.agents.records import Branch, ForkGroup, Node, Tree, Turn

INGREDIENTS = ["water", "olive oil", "chicken leg", "chicken wing", "flour", "black pepper", "red apple", "carrot",
               "yellow potato", "salt"]
STATES = ["raw, uncut", "roasted, uncut", "fried, sliced", "grilled, diced"]
VERBS = ["take {i}", "cook {i} in stove", "cook {i} in oven", "slice {i} with knife", "go to pantry", "go to kitchen"]


def _subagent(rng: random.Random, tree: int, k: int, dish: int | None = None) -> Node:
    dish = k + 1 if dish is None else dish
    items = rng.sample(INGREDIENTS, 3)
    goal = f"Prepare and eat dish_{dish}: " + ", ".join(f"{i} ({rng.choice(STATES)})" for i in items) + "."
    steps = [rng.choice(VERBS).format(i=rng.choice(items)) for _ in range(rng.randint(2, 6))]
    done = rng.random() < 0.5
    if done:
        steps += [f"prepare dish_{dish}", f"eat dish_{dish}"]
    progress = (f"- dish_{dish}: {3 if done else rng.randint(0, 2)}/3 ingredients prepared, meal_prepared={done}, "
                f"meal_eaten={done}")
    turns = [Turn(i, [], [], [], 0, code=f"<action>{a}</action>", output="ok") for i, a in enumerate(steps)]
    return Node(id=f"root/subagent-0-{k}", goal=goal, depth=1, parent_id="root", turns=turns,
                finish_message=f"dish_{dish} eaten" if done else None,
                misc={"final_observation": f"You are in the kitchen.\nDish progress:\n{progress}\n"})


def judge_trees(n_trees: int, subagents: int = 3, seed: int = 0, prefix: str = "t") -> list[Tree]:
    """Returns ``n_trees`` finished trees of a root and ``subagents`` sub-agents each (deterministic in ``seed``)."""
    rng = random.Random(seed)
    trees = []
    for t in range(n_trees):
        root = Node(id="root", goal="Prepare and eat every dish.", depth=0,
                    turns=[Turn(0, [], [], [], 0, code="<launch_subagent>...</launch_subagent>", output="ok")])
        nodes = {"root": root}
        for k in range(subagents):
            n = _subagent(rng, t, k)
            nodes[n.id] = n
        trees.append(Tree(id=f"{prefix}{t}", task_id=f"task{t}", root_id="root", nodes=nodes))
    return trees


def fork_group_trees(n_trees: int, branches: int = 4, seed: int = 0, prefix: str = "f") -> list[Tree]:
    """Returns ``n_trees`` rubric-generation trees (deterministic in ``seed``): the root delegated one dish, and its
    ``branches`` counterfactual branches of that delegation form one complete fork group with a valid rubric, every
    branch still unlabelled (as the collector leaves them for the deferred RT judge)."""
    rng = random.Random(seed)
    trees = []
    for t in range(n_trees):
        root = Node(id="root", goal="Prepare and eat every dish.", depth=0,
                    turns=[Turn(0, [], [], [], 0, code="<launch_subagent>...</launch_subagent>", output="ok")])
        nodes = {"root": root}
        group = ForkGroup(id=f"{prefix}{t}:fg0", parent_id="root", fork_step=0, child_depth=1, num_branches=branches,
                          rubric={"items": [{"criterion": "the dish was prepared", "weight": 0.5},
                                            {"criterion": "the dish was eaten", "weight": 0.5}]})
        for b in range(branches):
            n = _subagent(rng, t, b, dish=1)
            n.id = f"root/subagent-0-0#b{b}"
            nodes[n.id] = n
            group.branches.append(Branch(branch_index=b, trajectory_id=n.id, depth=1))
        trees.append(Tree(id=f"{prefix}{t}", task_id=f"task{t}", root_id="root", nodes=nodes,
                          stage="rubric_generation", fork_groups=[group]))
    return trees
