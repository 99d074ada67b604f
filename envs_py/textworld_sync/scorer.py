"""The composite checker of TextWorld-Sync (docs/design/textworld.md §9): binary success over every dish, no partial credit."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

_TRIVIAL = frozenset({"raw", "uncut"})


def score_task(task_dishes: Iterable[Mapping[str, Any]], object_tree: Mapping[str, Any]) -> dict:
    """Scores a world state against the task's dishes.

    `task_dishes` is the task's dish list ({dish_id, recipe: [{name, preparation}]}); `object_tree` is
    `World.get_object_tree()`. Returns {task_success, score (1.0/0.0), task_failure, completed_dishes, total_dishes,
    dish_results: [{dish_id, passed, ingredients_complete, meal_prepared, meal_eaten, invalid_or_deleted,
    completed_ingredients, total_ingredients, ingredients: [...]}]}.
    """
    tree_dishes = object_tree.get("dishes") or {}
    results = []
    for dish in task_dishes:
        dish_id = str(dish.get("dish_id"))
        state = tree_dishes.get(dish_id) or {}
        state_ings = state.get("ingredients") or {}
        ingredients, invalid = [], False
        for ing in dish.get("recipe") or []:
            name = str(ing.get("name"))
            s = state_ings.get(name) or {}
            collected = bool(s.get("collected", False))
            deleted = bool(s.get("deleted", False))
            expected = frozenset(ing.get("preparation") or ())
            observed = frozenset(s.get("preparation") or ())
            matches = observed == expected
            wrong = bool(observed - _TRIVIAL - expected)
            bad = deleted or wrong
            invalid = invalid or bad
            ingredients.append({
                "name": name, "collected": collected, "deleted": deleted, "expected": sorted(expected),
                "observed": sorted(observed), "matches": matches, "complete": collected and not deleted and matches,
                "invalid": bad,
            })
        complete = all(i["complete"] for i in ingredients)
        prepared, eaten = bool(state.get("meal_prepared", False)), bool(state.get("meal_eaten", False))
        results.append({
            "dish_id": dish_id, "passed": complete and prepared and eaten, "ingredients_complete": complete,
            "meal_prepared": prepared, "meal_eaten": eaten, "invalid_or_deleted": invalid,
            "completed_ingredients": sum(i["complete"] for i in ingredients), "total_ingredients": len(ingredients),
            "ingredients": ingredients,
        })
    success = bool(results) and all(r["passed"] for r in results)
    return {
        "task_success": success, "score": 1.0 if success else 0.0,
        "task_failure": any(r["invalid_or_deleted"] for r in results),
        "completed_dishes": sum(r["passed"] for r in results), "total_dishes": len(results),
        "dish_results": results,
    }


def failure_reason(report: Mapping[str, Any]) -> str:
    """Returns a one-line human-readable reason for a report: 'PASS' or what is missing / wrong."""
    if report.get("task_success"):
        return "PASS"
    parts = []
    for dish in report.get("dish_results", []):
        if dish["passed"]:
            continue
        missing = [i["name"] for i in dish["ingredients"] if not i["complete"]]
        wrong = [i["name"] for i in dish["ingredients"] if i["invalid"]]
        bits = []
        if wrong:
            bits.append("wrongly prepared or deleted: " + ", ".join(wrong))
        if missing:
            bits.append("ingredients not ready: " + ", ".join(missing))
        if not dish["meal_prepared"]:
            bits.append("meal not prepared")
        elif not dish["meal_eaten"]:
            bits.append("meal not eaten")
        parts.append(f"{dish['dish_id']}: " + "; ".join(bits))
    if not report.get("dish_results"):
        parts.append("task has no dishes")
    return "FAIL - " + " | ".join(parts)
