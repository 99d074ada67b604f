"""Checker and oracle of TextWorld-Sync: PASS only when every dish is exactly prepared and eaten
(docs/design/textworld.md §9)."""

import random

import pytest

from envs_py.textworld_sync import load_tasks, make_world, oracle_actions, oracle_split_actions, score_task
from envs_py.textworld_sync.solver import replay, run_oracle

TASKS = load_tasks("sample")


@pytest.mark.parametrize("rules", ["reference", "full"])
def test_oracle_solves_every_sample_within_budget(rules):
    for task in TASKS:
        actions = oracle_actions(task, rules)
        assert len(actions) <= task.max_steps, task.task_id
        world = replay(task, actions, rules)
        result = world.check("root")
        assert result.success and result.reason == "PASS", (task.task_id, result.reason)
        assert world.steps == len(actions) and world.done
        assert world.observe_full("root")[1]["tasksuccess"]


def test_split_oracle_solves_every_sample_within_budget():
    for task in TASKS:
        for n_agents in (2, 3):
            steps = oracle_split_actions(task, n_agents)
            assert len(steps) <= task.max_steps
            assert len({agent for agent, _ in steps}) == min(n_agents, len(task.dishes))
            assert replay(task, steps).check().success, task.task_id


def test_removing_last_eat_fails():
    for task in TASKS:
        actions = oracle_actions(task)
        last_eat = max(i for i, a in enumerate(actions) if a.startswith("eat "))
        world = replay(task, actions[:last_eat] + actions[last_eat + 1:])
        result = world.check()
        assert not result.success and "meal not eaten" in result.reason
        assert result.details["completed_dishes"] == len(task.dishes) - 1
        assert not world.observe_full("root")[1]["tasksuccess"]


def test_preparing_only_dish_1_fails():
    for task in TASKS:
        world = make_world(task)
        run_oracle(world, {"root": ["dish_1"]})
        report = world.check().details
        assert report["dish_results"][0]["passed"]
        assert not report["task_success"] and report["score"] == 0.0
        assert report["completed_dishes"] == 1


def test_full_rules_wrong_preparation_fails_and_stays_failed():
    task = next(t for t in TASKS if t.task_id.endswith("multi_dish_fork_join_easy_0000"))
    world = make_world(task, rules="full")
    acts = world.step("root", "take white onion").infos["validActions"]
    # Every cut and every cook is offered under the full rules, the wrong ones included.
    assert {"chop white onion", "slice white onion", "dice white onion", "mince white onion",
            "cook white onion in stove", "cook white onion in oven", "cook white onion on grill"} <= set(acts)
    r = world.step("root", "slice white onion")  # the recipe asks for diced
    assert r.done and r.infos["taskfailure"] and not r.infos["tasksuccess"]
    assert "dice white onion" not in r.infos["validActions"]  # irreversible: it is cut already
    for action in oracle_actions(task, "full"):  # everything else done right: still FAIL
        world.step("root", action)
    result = world.check()
    assert not result.success and result.details["task_failure"]
    assert "wrongly prepared" in result.reason
    assert world.failure and world.observe_full("root")[1]["taskfailure"]


def test_full_rules_wrong_cook_fails():
    task = next(t for t in TASKS if t.task_id.endswith("critical_path_easy_0001"))  # red onion grilled, uncut
    world = make_world(task, rules="full")
    world.step("root", "take red onion")
    world.step("root", "cook red onion in oven")
    assert world.check().details["task_failure"]
    ok = make_world(task, rules="full")
    ok.step("root", "take red onion")
    ok.step("root", "cook red onion on grill")
    assert ok.ready[ok.c.index["red onion"]] and not ok.check().details["task_failure"]


def test_reference_rules_only_offer_required_preparations():
    for task in TASKS:
        world = make_world(task)
        for i, name in enumerate(world.c.names):
            for cmd, word, _tool in world.c.prep_cmds[i]:
                assert word in world.c.expected[i], (name, cmd)


def test_scorer_rules_on_object_trees():
    task = TASKS[0]
    world = replay(task, oracle_actions(task))
    dishes = world.c.task_dishes()
    tree = world.get_object_tree()
    assert score_task(dishes, tree)["task_success"]
    tree["dishes"]["dish_1"]["ingredients"]["white onion"]["preparation"] = ["diced"]  # partial: not invalid
    report = score_task(dishes, tree)
    assert not report["task_success"] and not report["task_failure"]
    tree["dishes"]["dish_1"]["ingredients"]["white onion"]["preparation"] = ["fried", "diced"]  # wrong cook
    assert score_task(dishes, tree)["task_failure"]
    tree = world.get_object_tree()
    tree["dishes"]["dish_2"]["ingredients"]["flour"]["deleted"] = True
    report = score_task(dishes, tree)
    assert report["task_failure"] and not report["task_success"]
    assert score_task([], tree)["task_success"] is False  # no dishes: never PASS


@pytest.mark.parametrize("rules", ["reference", "full"])
def test_fast_success_flag_agrees_with_scorer_on_random_play(rules):
    rng = random.Random(7)
    for task in TASKS[::3]:
        world = make_world(task, rules)
        for _ in range(task.max_steps):
            acts = world.valid_actions("root")
            world.step("root", rng.choice(acts) if rng.random() < 0.9 else "bogus action")
            report = world.score_report()
            assert world.success() == report["task_success"]
            assert (world.failure or world.invalid) == report["task_failure"]
