"""Plans: the upstream gold planner (used for the task files) and a deficit solver for any inventory.

A plan is a list of gold steps ``{"action": "craft", "target": [item, executions], "ingredients": {name: units
consumed}, "result_count": items produced}``; replay a step with ``craft(step["ingredients"], (item,
step["result_count"]))``.
"""

from __future__ import annotations

from typing import Mapping

from envs_py.textcraft.recipes import RecipeBook


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _step(item: str, executions: int, ingredients: Mapping[str, int], result_count: int) -> dict:
    return {"action": "craft", "target": [item, executions],
            "ingredients": {k: u * executions for k, u in ingredients.items()},
            "result_count": result_count * executions}


def gold_plan(book: RecipeBook, inventory: Mapping[str, int], targets: Mapping[str, int]) -> list[dict] | None:
    """Returns the upstream (platoon) gold plan for ``targets`` from ``inventory``, or None if it runs short.

    Phase 1 walks the recipe tree path by path, each path rounding executions up on its own; phase 2 crafts
    every craftable item once, shallowest declared tier first, for what the inventory lacks of its total.
    Like upstream, items already held count toward the totals (it is a plan for the task files' inventories,
    which hold only base items); use :func:`solve` for net increases from arbitrary inventories.
    """
    totals: dict[str, int] = {}
    memo: dict[tuple[str, int], dict[str, int]] = {}

    def contribution(item: str, amount: int) -> dict[str, int]:
        # Totals added by one path-wise expansion of (item, amount), keys in pre-order first-seen order.
        key = (item, amount)
        got = memo.get(key)
        if got is None:
            got = {item: amount}
            r = book.recipe(item)
            if r is not None:
                execs = _ceil_div(amount, r.result_count)
                for ing, units in r.ingredients.items():
                    for k, v in contribution(ing, execs * units).items():
                        got[k] = got.get(k, 0) + v
            memo[key] = got
        return got

    for item, n in targets.items():
        for k, v in contribution(item, n).items():
            totals[k] = totals.get(k, 0) + v
    craftable = [x for x in totals if book.can_craft(x)]
    craftable.sort(key=book.crafting_depth)  # stable: first-seen order within a tier
    inv = dict(inventory)
    plan = []
    for item in craftable:
        r = book.recipe(item)
        lacking = totals[item] - inv.get(item, 0)
        if lacking <= 0:
            continue
        execs = _ceil_div(lacking, r.result_count)
        for ing, units in r.ingredients.items():
            if inv.get(ing, 0) < units * execs:
                return None
        for ing, units in r.ingredients.items():
            inv[ing] -= units * execs
        inv[item] = inv.get(item, 0) + r.result_count * execs
        plan.append(_step(item, execs, r.ingredients, r.result_count))
    return plan


def solve(book: RecipeBook, inventory: Mapping[str, int], targets: Mapping[str, int]) -> list[dict] | None:
    """Returns a plan that raises every target's count by its amount (net) from ``inventory``, or None.

    Deficit-driven: demands propagate from the highest declared tier down (an ingredient always has a lower
    tier than what it makes, so every demand on an item is known before the item is planned); held
    intermediates are used first, except target items, whose held units never count. None means the base
    items (or an unknown target) cannot cover the demand.
    """
    demand: dict[str, int] = {}
    for item, n in targets.items():
        if n > 0:
            demand[item] = demand.get(item, 0) + int(n)
    for item in demand:
        if not book.can_craft(item):
            return None
    execs: dict[str, int] = {}
    planned: set[str] = set()
    while True:
        pending = [x for x in demand if x not in planned and book.can_craft(x)]
        if not pending:
            break
        item = max(pending, key=book.crafting_depth)
        planned.add(item)
        r = book.recipe(item)
        # Net increase: a target's held units never count, so produce its amount plus what others consume.
        have = 0 if item in targets else inventory.get(item, 0)
        lacking = demand[item] - have
        if lacking <= 0:
            continue
        e = _ceil_div(lacking, r.result_count)
        execs[item] = e
        for ing, units in r.ingredients.items():
            demand[ing] = demand.get(ing, 0) + units * e
    for item, need in demand.items():
        if not book.can_craft(item) and inventory.get(item, 0) < need:
            return None
    order = sorted(execs, key=book.crafting_depth)
    plan = [_step(x, execs[x], book.recipe(x).ingredients, book.recipe(x).result_count) for x in order]
    return plan if simulate(book, inventory, plan) is not None else None


def simulate(book: RecipeBook, inventory: Mapping[str, int], plan: list[dict]) -> dict[str, int] | None:
    """Returns the inventory after replaying ``plan`` (exact recipe amounts), or None at the first invalid step."""
    inv = dict(inventory)
    for step in plan:
        item, execs = step["target"]
        r = book.recipe(item)
        if r is None or step["ingredients"] != {k: u * execs for k, u in r.ingredients.items()}:
            return None
        if any(inv.get(k, 0) < v for k, v in step["ingredients"].items()):
            return None
        for k, v in step["ingredients"].items():
            inv[k] -= v
            if inv[k] == 0:
                del inv[k]
        inv[item] = inv.get(item, 0) + r.result_count * execs
    return inv
