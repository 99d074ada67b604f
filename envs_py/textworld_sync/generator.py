"""Generating TextWorld-Sync tasks from a seed: 7 families × 4 difficulties, train / dev / test folds (docs/design/textworld.md §3, §13).

Per task: a profile is drawn from the difficulty band with an RNG seeded by the task seed (retried with
seed + k·1000003 while infeasible), then the global budget and cooldown from the runtime band; the family's
overrides are applied; dishes are drawn ingredient-disjoint from the ingredient table; all derived fields
(parallelism numbers, dependencies, descriptions) follow the formulas the official records satisfy. The upstream
RNG streams and ingredient database are not reproduced, so a seed gives *our* task, deterministically.
"""

from __future__ import annotations

import random
from typing import Iterable

from envs_py.textworld_sync import bands, catalog
from envs_py.textworld_sync.tasks import GAME, TaskSpec, compact_json, task_from_manifest_row

RETRY_STRIDE = 1000003
MAX_RETRIES = 128


class Infeasible(Exception):
    """The sampled profile cannot be realised with the ingredient table."""


def _draw(rng: random.Random, band: dict) -> dict:
    out = {}
    for key in sorted(band):
        spec = band[key]
        out[key] = rng.choice(spec["choices"]) if "choices" in spec else rng.randint(spec["min"], spec["max"])
    return out


def _work(option) -> int:
    return catalog.branch_work(option)


def _pick_option(rng: random.Random, options: list, complexity: str):
    if complexity == "low":
        return min(options, key=_work)
    if complexity == "high":
        return max(options, key=_work)
    return rng.choice(options)


def sample_dishes(rng: random.Random, profile: dict, family: str) -> list[dict]:
    """Returns ingredient-disjoint dishes for a profile (raises Infeasible when the table runs out)."""
    n = int(profile["dish_count"])
    per_dish = int(profile["ingredients_per_dish"])
    lo, hi = int(profile["min_prepared_ingredients_per_dish"]), int(profile["max_prepared_ingredients_per_dish"])
    if lo > hi or lo > per_dish:
        raise Infeasible("min_prepared exceeds max_prepared or the dish size")
    used: set[str] = set()
    dishes = []
    for d, complexity in enumerate(bands.dish_complexities(family, n, profile["preparation_complexity"])):
        available = [name for name in catalog.INGREDIENTS if name not in used]
        preparable = [x for x in available if any(set(o) != catalog.TRIVIAL for o in catalog.INGREDIENTS[x][1])]
        if len(preparable) < lo:
            raise Infeasible("not enough ingredients with a preparation")
        chosen = [(name, True) for name in rng.sample(preparable, lo)]
        rest = [x for x in available if x not in {c for c, _ in chosen}]
        raw_only = [x for x in rest if all(set(o) == catalog.TRIVIAL for o in catalog.INGREDIENTS[x][1])]
        fill = per_dish - lo
        if hi < per_dish:
            # Prefer ingredients that can only be raw/uncut, so the dish stays within max_prepared.
            first = rng.sample(raw_only, min(fill, len(raw_only)))
            others = [x for x in rest if x not in first]
            picks = first + rng.sample(others, fill - len(first)) if fill > len(first) else first
        else:
            if len(rest) < fill:
                raise Infeasible("not enough ingredients")
            picks = rng.sample(rest, fill)
        chosen += [(name, False) for name in picks]
        recipe, prepared = [], 0
        for name, must_prepare in chosen:
            locations, options = catalog.INGREDIENTS[name]
            options = list(options)
            nontrivial = [o for o in options if set(o) != catalog.TRIVIAL]
            if must_prepare:
                options = nontrivial
            elif prepared >= hi:
                options = [o for o in options if set(o) == catalog.TRIVIAL]
                if not options:
                    raise Infeasible("a filler needs a preparation beyond max_prepared")
            option = _pick_option(rng, options, complexity)
            prepared += set(option) != catalog.TRIVIAL
            recipe.append({
                "branch_work": _work(option), "candidate_source_locations": list(locations), "name": name,
                "preparation": list(option), "requires_preparation": not catalog.TRIVIAL <= set(option),
            })
        if len(recipe) != per_dish:
            raise Infeasible("dish size not reached")
        rng.shuffle(recipe)
        used.update(r["name"] for r in recipe)
        dishes.append({
            "dish_id": f"dish_{d + 1}", "estimated_branch_work": sum(r["branch_work"] for r in recipe),
            "ingredient_names": [r["name"] for r in recipe], "recipe": recipe,
        })
    return dishes


def describe(dishes: list[dict], family: str, capacity: int | None) -> dict:
    """Returns {"structured": text, "coarse": text} for the dishes plus the family's sentences (docs/design/textworld.md §3.4)."""
    n = len(dishes)
    extra = [s.format(capacity=capacity) for s in bands.FAMILY_SENTENCES.get(family, [])]
    structured = [f"Prepare and eat {n} independent dishes. Complete every dish.",
                  "The dishes are separate objectives and may be prepared independently before the final meal actions."]
    for dish in dishes:
        structured.append(f"Dish {dish['dish_id']}: prepare the following ingredients:")
        structured += [f"- {r['name']} ({', '.join(r['preparation'])})" for r in dish["recipe"]]
    structured.append("After all required ingredients for a dish are ready, prepare and eat that dish.")
    coarse = [f"Prepare and eat {n} dishes. Check the cookbook and complete every dish."]
    coarse += [f"Dish {dish['dish_id']} uses: {', '.join(r['name'] for r in dish['recipe'])}." for dish in dishes]
    return {"structured": "\n".join(structured + extra), "coarse": "\n".join(coarse + extra)}


def build_task(family: str, difficulty: str, fold: str, seed: int, offset: int, profile: dict, runtime: dict,
               dishes: list[dict]) -> TaskSpec:
    """Returns the full task record built from its sampled profile, runtime values and dishes (every derived
    field — game_params, parallelism, dependencies, descriptions — computed by the official formulas)."""
    layout = bands.fold_layout(fold)
    n = len(dishes)
    include_doors = bool(profile["include_doors"]) or family == "dependency_gate"
    capacity = int(profile["inventory_capacity"])
    game_params = {
        "includeDoors": int(include_doors), "limitInventorySize": int(bool(profile["limit_inventory_size"])),
        "numDishes": n, "numDistractorItems": int(profile["num_distractor_items"]),
        "numIngredientsPerDish": int(profile["ingredients_per_dish"]),
        "numIngredientsTotal": n * int(profile["ingredients_per_dish"]), "numLocations": int(profile["num_locations"]),
    }
    works = [d["estimated_branch_work"] for d in dishes]
    total = sum(works)
    critical = max(works) + 2 * n
    if family == "dependency_gate":
        deps = [{"from": "gate_1", "to": d["dish_id"], "type": "door"} for d in dishes[1:]]
    elif family == "hierarchical":
        deps = []
        for d in dishes:
            deps.append({"from": "root", "to": d["dish_id"], "type": "decompose"})
            deps += [{"from": d["dish_id"], "to": f"{d['dish_id']}::{name}", "type": "decompose"}
                     for name in d["ingredient_names"]]
    else:
        deps = []
    resource = {"inventory": capacity} if family == "resource_constrained" else (
        {"knife": 1, "stove": 1} if family == "conflict" else None)
    parallelism = {
        "branches": n, "critical_path_estimate": critical, "dependencies": deps,
        "estimated_sequential_actions": total + 2 * n + int(include_doors),
        "hierarchy_depth": 2 if family == "hierarchical" else 1,
        "ideal_parallel_speedup": round(total / critical, 4), "ingredient_disjoint": True,
        "mechanisms": {"tool_cooldown_steps": int(runtime["tool_cooldown_steps"])}, "pattern": bands.pattern(family),
        "resource_capacity": resource, "resource_conflict": family == "conflict",
        "shared_bottlenecks": list(bands.BOTTLENECKS.get(family, bands.DEFAULT_BOTTLENECKS)),
        "shared_environment_max_steps": int(runtime["shared_environment_max_steps"]), "total_branch_work": total,
    }
    descriptions = describe(dishes, family, capacity if family == "resource_constrained" else None)
    view = bands.TASK_VIEW[difficulty]
    generation = {
        "require_disjoint_ingredients": True, "requires_composite_environment": True,
        "requires_composite_scorer": True, "source_db_fold": layout.source_db_fold, "source_db_seed": seed,
        "task_family": family, "v7_parameter_band": bands.PARAMETER_BANDS[difficulty],
        "v7_runtime_band": bands.RUNTIME_BANDS[difficulty], "v7_sampled_parameters": dict(profile),
        "v7_sampled_runtime": dict(runtime), "v7_seed": seed,
    }
    row = {
        "task_id": f"{GAME}_{layout.id_name}_{family}_{difficulty}_{offset:04d}", "game": GAME,
        "fold": layout.fold, "difficulty": difficulty, "seed": seed, "game_params": compact_json(game_params),
        "task_description": descriptions[view],
        "generation_properties": {
            "base_game": "cookingworld", "task_family": family, "task_view": view, "task_descriptions": descriptions,
            "dishes": dishes, "parallelism": parallelism, "generation": generation,
        },
    }
    return task_from_manifest_row(row)


def generate_task(family: str, difficulty: str, seed: int, fold: str = "test", offset: int = 0) -> TaskSpec:
    """Returns the task of (family, difficulty) generated from `seed`; the same arguments give the same task."""
    if family not in bands.FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    if difficulty not in bands.PARAMETER_BANDS:
        raise ValueError(f"unknown difficulty {difficulty!r}")
    for k in range(MAX_RETRIES):
        attempt = seed + k * RETRY_STRIDE
        rng = random.Random(attempt)
        profile = _draw(rng, bands.PARAMETER_BANDS[difficulty])
        runtime = _draw(rng, bands.RUNTIME_BANDS[difficulty])
        try:
            dishes = sample_dishes(random.Random(attempt), profile, family)
        except Infeasible:
            continue
        return build_task(family, difficulty, fold, seed, offset, profile, runtime, dishes)
    raise RuntimeError(f"no feasible task for seed {seed} after {MAX_RETRIES} retries")


def generate_tasks(fold: str = "test", *, base_seed: int | None = None, difficulties: Iterable[str] | None = None,
                   families: Iterable[str] | None = None, per_cell: int | None = None) -> list[TaskSpec]:
    """Returns a fold's tasks in file order (difficulty-major, family-minor, offset-minor) with the fold's task
    counts and seed formula (docs/design/textworld.md §2.2, §2.4-§2.5). `base_seed` replaces the fold's base seed
    (a new task set of the same layout); `difficulties` / `families` select cells; `per_cell` caps the tasks per
    (difficulty, family)."""
    layout = bands.fold_layout(fold)
    want_d = set(difficulties) if difficulties is not None else None
    want_f = set(families) if families is not None else None
    tasks = []
    for position, (difficulty, count) in enumerate(layout.difficulty_counts):
        if want_d is not None and difficulty not in want_d:
            continue
        for f, (family, n) in enumerate(zip(bands.FAMILIES, layout.family_counts(count))):
            if want_f is not None and family not in want_f:
                continue
            for offset in range(n if per_cell is None else min(n, per_cell)):
                seed = layout.seed(position, f, offset, base_seed)
                tasks.append(generate_task(family, difficulty, seed, layout.fold, offset))
    return tasks
