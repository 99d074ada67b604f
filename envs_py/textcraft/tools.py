"""The TextCraft tool semantics (docs/design/textcraft.md §7) as functions of a recipe book and an inventory dict.

Every function validates its (untrusted) arguments and never raises on bad input: errors are returned as the
``Error: ...`` strings of docs/design/textcraft.md §7, and the inventory is only changed by a fully valid craft.
"""

from __future__ import annotations

from typing import Any

from envs_py.textcraft.recipes import RecipeBook


def _tname(x: Any) -> str:
    return type(x).__name__


def get_info(book: RecipeBook, inventory: dict[str, int], items: Any) -> list[dict] | str:
    """Returns one info dict per item name (unknown names are not an error), or an error string for bad input."""
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, (list, tuple)):
        return f"Error: items must be a list of item names, got {_tname(items)}"
    out = []
    for name in items:
        if not isinstance(name, str):
            return f"Error: item name must be a string, got {_tname(name)}"
        r = book.recipe(name)
        out.append({
            "item": name,
            "can_craft": r is not None,
            "is_base": book.is_base_item(name),
            "in_inventory": inventory.get(name, 0),
            "crafting_depth": book.crafting_depth(name),
            "recipes": [] if r is None else [{"ingredients": dict(r.ingredients), "result_count": r.result_count}],
        })
    return out


def view_inventory(inventory: dict[str, int]) -> dict[str, int]:
    """Returns a copy of the inventory without zero entries."""
    return {k: v for k, v in inventory.items() if v > 0}


def _is_int(x: Any) -> bool:
    return isinstance(x, int)  # bool counts as int, as upstream


def craft(book: RecipeBook, inventory: dict[str, int], ingredients: Any, target: Any) -> str:
    """Applies one craft to ``inventory`` in place; returns ``Successfully crafted ...`` or an ``Error: ...`` string."""
    if not isinstance(ingredients, dict):
        return f"Error: ingredients must be a dict, got {_tname(ingredients)}"
    if not isinstance(target, tuple) or len(target) != 2:
        return "Error: target must be a tuple of (item_name, count)"
    item, total = target
    if not isinstance(item, str):
        return f"Error: target item must be a string, got {_tname(item)}"
    if not _is_int(total):
        return f"Error: target count must be an int, got {_tname(total)}"
    if total <= 0:
        return f"Error: target count must be positive, got {total}"
    for name, n in ingredients.items():
        if not isinstance(name, str):
            return f"Error: ingredient name must be a string, got {_tname(name)}"
        if not _is_int(n):
            return f"Error: ingredient count for {name} must be an int, got {_tname(n)}"
        if n <= 0:
            return f"Error: ingredient count for {name} must be positive, got {n}"
    r = book.recipe(item)
    if r is None:
        return f"Error: No recipe found for {item}"
    reason = _match(r, inventory, ingredients, int(total))
    if reason is not None:
        return f"Error: All 1 recipe(s) failed for {item}. Errors:\nRecipe 1: {reason}"
    for name, n in ingredients.items():
        left = inventory[name] - int(n)
        if left:
            inventory[name] = left
        else:
            del inventory[name]
    inventory[item] = inventory.get(item, 0) + int(total)
    return f"Successfully crafted {int(total)} {item}(s)"


def _match(r, inventory: dict[str, int], ingredients: dict, total: int) -> str | None:
    if total % r.result_count:
        return f"Target count {total} is not divisible by recipe result count {r.result_count}"
    execs = total // r.result_count
    for name, units in r.ingredients.items():
        if name not in ingredients:
            return f"Missing required ingredient {name}"
        if ingredients[name] != units * execs:
            return f"Wrong amount of {name}. Need {units * execs}, provided {ingredients[name]}"
    extra = [k for k in ingredients if k not in r.ingredients]
    if extra:
        return f"Extra ingredients not required: {', '.join(extra)}"
    short = [f"{k}: need {n}, have {inventory.get(k, 0)}" for k, n in ingredients.items() if inventory.get(k, 0) < n]
    if short:
        return "Insufficient ingredients in inventory: " + ", ".join(short)
    return None
