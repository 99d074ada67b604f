"""Difficulty bands, the seven task families and the fold layouts of TextWorld-Sync (docs/design/textworld.md §2.4-§2.5, §4, §13)."""

from __future__ import annotations

import dataclasses

FAMILIES: tuple[str, ...] = (
    "multi_dish_fork_join", "critical_path", "load_balanced", "resource_constrained",
    "dependency_gate", "conflict", "hierarchical",
)
DIFFICULTY_INDEX = {"easy": 0, "medium": 1, "hard": 2, "extreme": 3}


def _mm(lo: int, hi: int) -> dict:
    return {"max": hi, "min": lo}


# The generator config's bands (textworld_v9.json), exactly as the task records copy them.
PARAMETER_BANDS: dict[str, dict] = {
    "easy": {
        "dish_count": _mm(2, 2), "include_doors": {"choices": [False]}, "ingredients_per_dish": _mm(3, 3),
        "inventory_capacity": _mm(2, 2), "limit_inventory_size": {"choices": [False]},
        "max_prepared_ingredients_per_dish": _mm(1, 2), "min_prepared_ingredients_per_dish": _mm(1, 1),
        "num_distractor_items": _mm(3, 5), "num_locations": _mm(5, 6),
        "preparation_complexity": {"choices": ["low", "medium"]},
    },
    "medium": {
        "dish_count": _mm(2, 4), "include_doors": {"choices": [True]}, "ingredients_per_dish": _mm(3, 4),
        "inventory_capacity": _mm(1, 2), "limit_inventory_size": {"choices": [True]},
        "max_prepared_ingredients_per_dish": _mm(3, 3), "min_prepared_ingredients_per_dish": _mm(2, 3),
        "num_distractor_items": _mm(6, 12), "num_locations": _mm(7, 10),
        "preparation_complexity": {"choices": ["medium", "high"]},
    },
    "hard": {
        "dish_count": _mm(4, 5), "include_doors": {"choices": [True]}, "ingredients_per_dish": _mm(4, 4),
        "inventory_capacity": _mm(1, 1), "limit_inventory_size": {"choices": [True]},
        "max_prepared_ingredients_per_dish": _mm(3, 3), "min_prepared_ingredients_per_dish": _mm(3, 3),
        "num_distractor_items": _mm(12, 18), "num_locations": _mm(10, 11),
        "preparation_complexity": {"choices": ["high"]},
    },
    "extreme": {
        "dish_count": _mm(5, 5), "include_doors": {"choices": [True]}, "ingredients_per_dish": _mm(4, 4),
        "inventory_capacity": _mm(1, 1), "limit_inventory_size": {"choices": [True]},
        "max_prepared_ingredients_per_dish": _mm(3, 3), "min_prepared_ingredients_per_dish": _mm(3, 3),
        "num_distractor_items": _mm(16, 20), "num_locations": _mm(10, 11),
        "preparation_complexity": {"choices": ["high"]},
    },
}
RUNTIME_BANDS: dict[str, dict] = {
    "easy": {"shared_environment_max_steps": _mm(115, 125), "tool_cooldown_steps": {"choices": [0]}},
    "medium": {"shared_environment_max_steps": _mm(95, 100), "tool_cooldown_steps": {"choices": [0, 1]}},
    "hard": {"shared_environment_max_steps": _mm(75, 90), "tool_cooldown_steps": {"choices": [1]}},
    "extreme": {"shared_environment_max_steps": _mm(65, 80), "tool_cooldown_steps": {"choices": [1]}},
}
TASK_VIEW = {"easy": "structured", "medium": "structured", "hard": "structured", "extreme": "coarse"}

DEFAULT_BOTTLENECKS = ["kitchen", "meal_preparation", "meal_eating"]
BOTTLENECKS = {"resource_constrained": ["knife", "stove", "kitchen"], "conflict": ["knife", "stove"]}
GATE_SENTENCE = "Some ingredient locations are behind an access gate that must be opened first."
FAMILY_SENTENCES = {
    "critical_path": ["The dishes do not require equal amounts of preparation work."],
    "load_balanced": ["The preparation workloads of the dishes are intentionally different."],
    "resource_constrained": [
        "The shared inventory can hold at most {capacity} ingredients at once.",
        "The kitchen and preparation tools are shared across all dishes.",
    ],
    "dependency_gate": [GATE_SENTENCE],
    "conflict": ["Several dishes require shared kitchen tools; coordinate their use."],
    "hierarchical": ["Each dish contains multiple ingredient-level objectives that can be handled as a group."],
}


def pattern(family: str) -> str:
    """Returns the family's parallelism pattern name ('fork_join' for multi_dish_fork_join)."""
    return "fork_join" if family == "multi_dish_fork_join" else family


def dish_complexities(family: str, n_dishes: int, default: str) -> list[str]:
    """Returns the per-dish preparation complexity: critical_path low×(N−2), medium, high; load_balanced
    low×(N−1), high; every other family the profile's complexity for each dish."""
    if family == "critical_path":
        return (["low"] * max(n_dishes - 2, 0) + ["medium", "high"])[-n_dishes:]
    if family == "load_balanced":
        return (["low"] * max(n_dishes - 1, 0) + ["high"])[-n_dishes:]
    return [default] * n_dishes


@dataclasses.dataclass(frozen=True)
class FoldLayout:
    """How one fold's files are laid out: name in ids, difficulty counts in order, seed formula, names."""

    fold: str            # the manifest's split / every task's fold
    id_name: str         # the fold's word inside task ids
    source_db_fold: str
    dataset: str
    difficulty_counts: tuple[tuple[str, int], ...]
    base_seed: int
    difficulty_stride: int
    family_stride: int

    def family_counts(self, count: int) -> list[int]:
        """Returns how `count` tasks of one difficulty are dealt over the 7 families (the first ones get one more)."""
        base, extra = divmod(count, len(FAMILIES))
        return [base + (1 if f < extra else 0) for f in range(len(FAMILIES))]

    def seed(self, difficulty_position: int, family_index: int, offset: int, base_seed: int | None = None) -> int:
        """Returns a task's seed from the fold's formula (docs/design/textworld.md §2.5)."""
        base = self.base_seed if base_seed is None else base_seed
        return base + self.difficulty_stride * difficulty_position + self.family_stride * family_index + offset


FOLDS: dict[str, FoldLayout] = {
    # test: seed = 820000 + 1000·d + 100·f + offset, d in easy/medium/hard/extreme order.
    "test": FoldLayout("test", "test", "test", "TextWorldExpress-MultiDish-V9-Test",
                       (("easy", 350), ("medium", 350), ("hard", 350), ("extreme", 350)), 820000, 1000, 100),
    # dev: seed = 860000 + 100000·d + 200·f + offset. 50 per difficulty reproduces the family counts 32/28×6.
    "validation": FoldLayout("validation", "dev", "valid", "TextWorldExpress-MultiDish-V9-Validation",
                             (("easy", 50), ("medium", 50), ("hard", 50), ("extreme", 50)), 860000, 100000, 200),
    # train: seed = 850000 + 100000·i + 200·f + offset, i in the JSON order medium, extreme, hard.
    "train": FoldLayout("train", "train", "train", "TextWorldExpress-MultiDish-V9-Train",
                        (("medium", 900), ("extreme", 450), ("hard", 150)), 850000, 100000, 200),
}
FOLD_ALIASES = {"dev": "validation", "valid": "validation", "val": "validation"}


def fold_layout(fold: str) -> FoldLayout:
    """Returns the layout of 'test', 'validation' (alias 'dev') or 'train'."""
    key = FOLD_ALIASES.get(fold, fold)
    if key not in FOLDS:
        raise ValueError(f"unknown fold {fold!r}; expected one of {sorted(FOLDS)} or {sorted(FOLD_ALIASES)}")
    return FOLDS[key]
