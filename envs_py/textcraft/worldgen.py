"""Builds a TextCraft-Synth recipe world from a seed, following docs/design/textcraft.md §1.2-§1.3 draw for draw.

With seed 42 and 25 items per domain and tier this reproduces the official 1402-recipe world exactly (tested
against the packaged ``recipes.json``). The reference's module-level ``random`` stream is an explicit
``random.Random(seed)`` here, which draws the same numbers without touching global state.
"""

from __future__ import annotations

import random

from envs_py.textcraft.recipes import Recipe, RecipeBook

DOMAINS = (("metal", "m"), ("crystal", "c"), ("organic", "o"), ("arcane", "a"), ("tech", "t"))
LETTER_DOMAIN = {letter: name for name, letter in DOMAINS}
MAX_TIER = 12
# (name, tier, domain letters) of the cross-domain items, added after all domains.
CROSS_ITEMS = (
    ("x10_mc", 10, "mc"), ("x10_ot", 10, "ot"), ("x10_am", 10, "am"), ("x10_ct", 10, "ct"),
    ("x11_mct", 11, "mct"), ("x11_oam", 11, "oam"), ("x11_act", 11, "act"), ("x11_tca", 11, "tca"),
    ("x12_mcat", 12, "mcat"), ("x12_oacm", 12, "oacm"), ("x12_tcoa", 12, "tcoa"), ("x12_all", 12, "mcoat"),
)


def base_name(letter: str, k: int) -> str:
    """Returns the tier-0 item name of domain ``letter`` with index ``k`` (0..9)."""
    return f"{letter}{k}_ore" if letter in "mc" else f"raw_{letter}{k}"


def base_ingredient_count(tier: int) -> int:
    """Returns b_t, the minimum ingredient count of a tier's recipes."""
    return 1 if tier == 1 else 2 if tier <= 7 else 3 if tier <= 11 else 4


def result_count_range(tier: int) -> tuple[int, int]:
    """Returns the inclusive result-count range of a tier."""
    return (2, 4) if tier == 1 else (2, 3) if tier == 2 else (1, 2) if tier <= 5 else (1, 1)


def items_in_tier(tier: int, items_per_domain_tier: int) -> int:
    """Returns n_t, the number of items per domain in a tier >= 1."""
    return max(1, items_per_domain_tier - tier // 3)


def _weighted_pick(rng: random.Random, candidates: list[tuple[str, int]], k: int) -> list[str]:
    weights = [1.0 / (dist + 1) for _, dist in candidates]
    available = list(range(len(candidates)))
    picked: list[str] = []
    for _ in range(k):
        total = sum(weights[j] for j in available)
        r = rng.random() * total
        acc = 0.0
        choice_pos = len(available) - 1  # float round-off fallback: the last available candidate
        for pos, j in enumerate(available):
            acc += weights[j]
            if acc >= r:
                choice_pos = pos
                break
        picked.append(candidates[available.pop(choice_pos)][0])
    return picked


def generate_world(seed: int = 42, items_per_domain_tier: int = 25) -> RecipeBook:
    """Returns the RecipeBook generated from ``seed`` with ``items_per_domain_tier`` items (tiers 0..12)."""
    rng = random.Random(seed)
    recipes: dict[str, Recipe] = {}
    by_tier: dict[int, list[str]] = {t: [] for t in range(MAX_TIER + 1)}
    by_dt: dict[tuple[str, int], list[str]] = {}
    base_items: list[str] = []
    for domain, letter in DOMAINS:
        for i in range(items_per_domain_tier):
            name = base_name(letter, i % 10)
            base_items.append(name)
            by_tier[0].append(name)
            by_dt.setdefault((letter, 0), []).append(name)
        for t in range(1, MAX_TIER + 1):
            for i in range(items_in_tier(t, items_per_domain_tier)):
                prefix = f"{letter}{i % 10}"
                name = f"{prefix}_i{t}" if t <= 5 else f"{prefix}_i{t}_{t}"
                if name in recipes:
                    name = f"{name}_{i}"
                candidates = [(e, t - s) for s in range(max(0, t - 2), t) for e in by_dt.get((letter, s), [])]
                if t >= 4:
                    cross = rng.choice(range(max(0, t - 4), t - 2))
                    lst = by_dt.get((letter, cross), [])
                    if lst:
                        candidates.append((rng.choice(lst), t - cross))
                k = base_ingredient_count(t) + rng.randint(0, min(2, t // 3))
                k = min(k, len(candidates), 6)
                picked = _weighted_pick(rng, candidates, k)
                ingredients: dict[str, int] = {}
                for p in picked:
                    ingredients[p] = rng.randint(1, 2) if t <= 4 else rng.randint(1, 1)
                lo, hi = result_count_range(t)
                recipes[name] = Recipe(name, rng.randint(lo, hi), ingredients, t, domain)
                by_tier[t].append(name)
                by_dt.setdefault((letter, t), []).append(name)
    for name, t, letters in CROSS_ITEMS:
        ingredients = {}
        for letter in letters:
            s = next((s for s in range(max(1, t - 3), t) if by_dt.get((letter, s))), None)
            if s is None:
                continue
            picked_item = rng.choice(by_dt[(letter, s)])  # drawn before its count
            ingredients[picked_item] = rng.randint(1, 2)
        recipes[name] = Recipe(name, 1, ingredients, t, LETTER_DOMAIN[letters[0]])
        by_tier[t].append(name)
    return RecipeBook(recipes, base_items, by_tier, seed=seed, items_per_domain_tier=items_per_domain_tier)
