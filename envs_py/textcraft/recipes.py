"""The TextCraft-Synth recipe book: one recipe per craftable item, base items, declared tiers.

The official world (generator seed 42, 25 items per domain and tier, 1402 recipes) ships as package data
(``data/recipes.json``); other worlds are rebuilt in memory by :mod:`envs_py.textcraft.worldgen`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from typing import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One recipe: executing it consumes ``ingredients`` (name -> units) and yields ``result_count`` items."""

    result_item: str
    result_count: int
    ingredients: Mapping[str, int]
    depth: int
    domain: str


class RecipeBook:
    """All recipes of one world plus its base items. Immutable after construction; shared by every world copy."""

    def __init__(self, recipes: Mapping[str, Recipe], base_items: Iterable[str],
                 items_by_tier: Mapping[int, list[str]] | None = None, seed: int | None = None,
                 items_per_domain_tier: int | None = None):
        self.recipes: dict[str, Recipe] = dict(recipes)
        # Generation order, deduplicated: used as the hash-independent distractor list of new worlds.
        self.base_items: tuple[str, ...] = tuple(dict.fromkeys(base_items))
        self._base_set = frozenset(self.base_items)
        self.items_by_tier: dict[int, list[str]] = {int(k): list(v) for k, v in (items_by_tier or {}).items()}
        self.seed = seed
        self.items_per_domain_tier = items_per_domain_tier
        self._bpo_cache: dict[str, dict[str, int]] = {}

    # -- the loader interface of docs/design/textcraft.md §1.1 -----------------------------------------------
    def recipe(self, item: str) -> Recipe | None:
        """Returns the item's recipe, or None for base and unknown items."""
        return self.recipes.get(item)

    def can_craft(self, item: str) -> bool:
        """Returns whether the item has a recipe."""
        return item in self.recipes

    def is_base_item(self, item: str) -> bool:
        """Returns whether the item is a tier-0 base material."""
        return item in self._base_set

    def crafting_depth(self, item: str) -> int:
        """Returns the item's declared tier (0 for base items and unknown names)."""
        r = self.recipes.get(item)
        return r.depth if r is not None else 0

    # -- docs/design/textcraft.md §1.4 ---------------------------------------------------------------------------
    def base_per_one(self, item: str) -> dict[str, int]:
        """Returns the base units one unit of ``item`` needs, ignoring result counts, in depth-first key order."""
        cached = self._bpo_cache.get(item)
        if cached is not None:
            return cached
        out: dict[str, int] = {}
        r = self.recipes.get(item)
        if r is None:
            out[item] = 1
        else:
            for ing, units in r.ingredients.items():
                for base, n in self.base_per_one(ing).items():
                    out[base] = out.get(base, 0) + units * n
        self._bpo_cache[item] = out
        return out

    def requirement(self, item: str, count: int) -> dict[str, int]:
        """Returns ``count`` x base_per_one(item): the generator's (overestimated) base requirement."""
        return {k: v * count for k, v in self.base_per_one(item).items()}

    def tree_items(self, item: str) -> list[str]:
        """Returns every craftable item in ``item``'s recipe tree, first-seen in a depth-first pre-order walk."""
        seen: dict[str, None] = {}

        def walk(x: str) -> None:
            r = self.recipes.get(x)
            if r is None or x in seen:  # a seen item's whole subtree is already listed
                return
            seen[x] = None
            for ing in r.ingredients:
                walk(ing)

        walk(item)
        return list(seen)

    def to_json(self) -> dict:
        """Returns the recipes in the data-file layout (recipe id -> fields)."""
        return {k: {"result_item": r.result_item, "result_count": r.result_count,
                    "ingredients": dict(r.ingredients), "depth": r.depth, "domain": r.domain}
                for k, r in self.recipes.items()}


def _data_text(name: str) -> str:
    return resources.files("envs_py.textcraft").joinpath("data").joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def world_meta() -> dict:
    """Returns the packaged world metadata (base items, tier lists, item split, distractor order)."""
    return json.loads(_data_text("world_meta.json"))


@functools.lru_cache(maxsize=1)
def official_recipes() -> RecipeBook:
    """Returns the official runtime world (1402 recipes), loaded from package data and cached."""
    raw = json.loads(_data_text("recipes.json"))
    meta = world_meta()
    recipes = {k: Recipe(v["result_item"], int(v["result_count"]), dict(v["ingredients"]), int(v["depth"]),
                         v["domain"]) for k, v in raw.items()}
    tiers = {int(t): items for t, items in meta["items_by_tier_generation_order"].items()}
    return RecipeBook(recipes, meta["base_items_generation_order"], tiers, seed=int(meta["seed"]),
                      items_per_domain_tier=int(meta["items_per_domain_tier"]))


@functools.lru_cache(maxsize=8)
def recipe_book(seed: int = 42, items_per_domain_tier: int = 25) -> RecipeBook:
    """Returns the world for (seed, items per domain and tier): the packaged one for (42, 25), else generated."""
    if (seed, items_per_domain_tier) == (42, 25):
        return official_recipes()
    from envs_py.textcraft.worldgen import generate_world

    return generate_world(seed, items_per_domain_tier)
