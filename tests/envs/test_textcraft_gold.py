"""Every official gold plan, replayed through the tools, passes the checker; broken episodes fail."""

import asyncio
import random

import pytest

from envs_py.textcraft import (TextCraftSession, TextCraftWorld, gold_plan, load_tasks, official_recipes, simulate,
                               solve)


def replay(world, plan, agent="root"):
    tools = world.tools(agent)
    for step in plan:
        out = tools["craft"](step["ingredients"], (step["target"][0], step["result_count"]))
        assert out.startswith("Successfully crafted"), out
    return tools


@pytest.mark.parametrize("split,n", [("val", 632), ("train", 852)])
def test_every_gold_plan_passes_the_checker(split, n):
    tasks = load_tasks(split)
    assert len(tasks) == n
    book = official_recipes()
    for t in tasks:
        world = TextCraftWorld.from_task(t)
        tools = replay(world, t.payload["gold_trajectory"])
        assert not world.check("root").success  # no finish yet
        tools["finish"]("done")
        res = world.check("root")
        assert res.success, (t.task_id, res.reason)
        # Our planner rebuilds the stored plan exactly, and the step count is the tree size.
        assert gold_plan(book, t.payload["initial_inventory"], t.payload["target_items"]) == t.payload["gold_trajectory"]
        assert t.payload["num_craft_steps"] == len(book.tree_items(next(iter(t.payload["target_items"]))))


def test_dropping_the_final_craft_or_finish_fails():
    for t in load_tasks("val")[:60]:
        plan = t.payload["gold_trajectory"]
        w = TextCraftWorld.from_task(t)
        replay(w, plan[:-1])["finish"]("done")
        assert not w.check().success and "short by" in w.check().reason
        w = TextCraftWorld.from_task(t)
        replay(w, plan)
        assert w.check().reason == "ended without calling finish()"
        w.tools("root")["finish"]("")  # an empty message counts as not finishing
        assert not w.check().success


def test_items_held_at_start_do_not_count():
    t = load_tasks("val")[0]
    (item, n), = t.payload["target_items"].items()
    inv = dict(t.payload["initial_inventory"], **{item: n})
    w = TextCraftWorld(official_recipes(), inv)
    w.task = None
    w.add_agent("root", {item: n}, None)
    w.tools("root")["finish"]("already have it")
    assert not w.check("root").success
    plan = solve(official_recipes(), inv, {item: n})
    replay(w, plan)
    assert w.check("root").success and w.inventory[item] >= 2 * n


def test_solver_from_arbitrary_inventories():
    book = official_recipes()
    rng = random.Random(0)
    tasks = load_tasks("val")
    for t in rng.sample(tasks, 80):
        targets = t.payload["target_items"]
        inv = dict(t.payload["initial_inventory"])
        # Add some intermediates of the tree and a unit of the target itself.
        for x in rng.sample(book.tree_items(next(iter(targets))), k=min(3, t.payload["num_craft_steps"])):
            inv[x] = inv.get(x, 0) + rng.randint(1, 4)
        plan = solve(book, inv, targets)
        assert plan is not None
        end = simulate(book, inv, plan)
        assert all(end.get(k, 0) - inv.get(k, 0) >= v for k, v in targets.items())
    assert solve(book, {}, {"o5_i2_15": 1}) is None
    assert solve(book, {"m0_ore": 5}, {"not_an_item": 1}) is None


def test_gold_plans_through_sandboxed_cells():
    tasks = load_tasks("val")
    picked = [next(t for t in tasks if t.difficulty == d) for d in ("easy", "medium", "hard", "extreme")]

    async def episode(task):
        s = TextCraftSession.from_task(task)
        plan = task.payload["gold_trajectory"]
        half = len(plan) // 2
        cells = ["inv = view_inventory()\ninfo = get_info(list(inv))\nlen(info)"]
        for chunk in (plan[:half], plan[half:]):
            cells.append("\n".join(f"assert craft({st['ingredients']!r}, ({st['target'][0]!r}, {st['result_count']}))"
                                   ".startswith('Successfully')" for st in chunk) or "pass")
        cells.append("finish('crafted everything')")
        results = [await s.run_cell("root", c) for c in cells]
        await s.close()
        return results, s.world.check("root")

    for task in picked:
        results, check = asyncio.run(episode(task))
        assert all(r["ok"] for r in results), (task.task_id, results)
        assert results[-1]["finished"] and check.success, (task.task_id, check.reason)
