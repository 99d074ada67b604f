"""Task generation by the upstream rules (docs/design/textcraft.md §2-§4): item split, difficulty bands, inventories, gold plans.

``generate_tasks()`` with its defaults reproduces the packaged official files row for row (same ids, buffers
and distractors) because it uses the distractor order stored with them; any other seed or recipe world gives a
new, equally well-formed task set, deterministic from its seeds.
"""

from __future__ import annotations

import random
from typing import Sequence

from envs_py.core import Task
from envs_py.textcraft.recipes import RecipeBook, recipe_book, world_meta
from envs_py.textcraft.solver import gold_plan
from envs_py.textcraft.tasks import goal_text, task_from_row

# name -> (min tier, max tier, targets per task, max count), in generation order.
BANDS = {"easy": (2, 3, 1, 3), "medium": (4, 6, 1, 3), "hard": (7, 9, 1, 2), "extreme": (10, 12, 1, 2)}
MIX = {"easy": 0.25, "medium": 0.35, "hard": 0.25, "extreme": 0.15}
ATTEMPTS_PER_TASK = 30


def split_items(book: RecipeBook, seed: int, train_fraction: float = 0.8) -> tuple[dict, dict, random.Random]:
    """Returns (train items by tier, val items by tier, the rng left after the shuffles) for tiers 1..12."""
    rng = random.Random(seed)
    train, val = {}, {}
    for t in range(1, 13):
        items = list(book.items_by_tier.get(t, []))
        rng.shuffle(items)
        cut = int(train_fraction * len(items))
        train[t], val[t] = items[:cut], items[cut:]
    return train, val, rng


def _attempt(rng: random.Random, book: RecipeBook, pool: Sequence[str], band: str, max_count: int,
             used: set, distractors: Sequence[str]) -> dict | None:
    rng.randint(1, 1)  # number of targets: always one, but it consumes randomness
    item = rng.sample(pool, 1)[0]
    count = rng.randint(1, max_count)
    if (item, count) in used:
        return None
    required = book.requirement(item, count)
    inventory = {}
    for base, need in required.items():
        inventory[base] = need + rng.randint(0, max(1, need // 2))
    for _ in range(rng.randint(1, 3)):
        extra = rng.choice(distractors)
        if extra not in inventory:
            inventory[extra] = rng.randint(1, 5)
    targets = {item: count}
    plan = gold_plan(book, inventory, targets)
    if plan is None:
        return None
    used.add((item, count))
    tree = book.tree_items(item)
    return {"difficulty": band, "goal": goal_text(targets), "max_steps": 75, "target_items": targets,
            "initial_inventory": inventory, "max_depth": book.crafting_depth(item), "num_craft_steps": len(tree),
            "gold_trajectory": plan, "required_base": required,
            "recipes_needed": {x: {"ingredients": dict(book.recipe(x).ingredients),
                                   "result_count": book.recipe(x).result_count, "depth": book.recipe(x).depth}
                               for x in tree}}


def _split_tasks(rng, book, items_by_tier, size, distractors, mix) -> list[dict]:
    rows = []
    for band, (lo, hi, _, max_count) in BANDS.items():
        target = int(size * mix[band])
        pool = [x for t in range(lo, hi + 1) for x in items_by_tier.get(t, [])]
        used: set = set()
        found: list[dict] = []
        attempts = 0
        while pool and len(found) < target and attempts < ATTEMPTS_PER_TASK * target:
            attempts += 1
            row = _attempt(rng, book, pool, band, max_count, used, distractors)
            if row is not None:
                found.append(row)
        rows.extend(found)
    return rows


def generate_tasks(split: str = "val", seed: int = 42, *, world_seed: int = 42, items_per_domain_tier: int = 25,
                   n_train: int = 10000, n_val: int = 1000, mix: dict | None = None,
                   distractor_order: Sequence[str] | None = None, shuffle_seed: int | None = None,
                   difficulty: str | None = None) -> list[Task]:
    """Returns generated tasks of ``split`` ("train", "val" or "both"), optionally only one ``difficulty``.

    Train is always generated first (the val stream continues it), as upstream. Ids are
    ``textcraft_synth.{split}.{i}`` after a shuffle with ``shuffle_seed`` (default seed + 1). The default
    distractor order is the one stored with the official files for the official world, else the world's
    base items in generation order (hash-independent either way).
    """
    if split not in ("train", "val", "both"):
        raise ValueError(f"split must be 'train', 'val' or 'both', got {split!r}")
    book = recipe_book(world_seed, items_per_domain_tier)
    if distractor_order is None:
        official = (world_seed, items_per_domain_tier) == (42, 25)
        distractor_order = world_meta()["distractor_choice_list_used_for_these_files"] if official else book.base_items
    mix = dict(mix or MIX)
    train_items, val_items, rng = split_items(book, seed)
    train = _split_tasks(rng, book, train_items, n_train, list(distractor_order), mix)
    val = _split_tasks(rng, book, val_items, n_val, list(distractor_order), mix)
    shuffle_rng = random.Random(seed + 1 if shuffle_seed is None else shuffle_seed)
    shuffle_rng.shuffle(train)
    shuffle_rng.shuffle(val)
    out: list[Task] = []
    world = {"seed": world_seed, "items_per_domain_tier": items_per_domain_tier}
    for name, rows in (("train", train), ("val", val)):
        if split not in (name, "both"):
            continue
        for i, row in enumerate(rows):
            if difficulty is None or row["difficulty"] == difficulty:
                out.append(task_from_row({"task_id": f"textcraft_synth.{name}.{i}", **row, "world": world}))
    return out
