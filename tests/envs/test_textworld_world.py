"""World rules, observation text and infos of TextWorld-Sync (docs/design/textworld.md §5-§8), incl. the worked
example of §7.5."""

import copy

from envs_py.textworld_sync import load_tasks, make_world
from envs_py.textworld_sync.world import INVALID_ACTION

TASKS = {t.task_id.rsplit("_test_", 1)[1]: t for t in load_tasks("sample")}
EASY0 = TASKS["multi_dish_fork_join_easy_0000"]

WORKED_SOLUTION = [
    "take white onion", "dice white onion", "cook white onion on grill",
    "take yellow bell pepper", "dice yellow bell pepper", "cook yellow bell pepper on grill",
    "go to pantry", "take salt", "take black pepper", "take olive oil", "take flour",
    "prepare dish_1", "eat dish_1", "prepare dish_2", "eat dish_2",
]

INITIAL_OBSERVATION = """You are in the kitchen.
Visible objects: white onion, yellow bell pepper
Shared kitchen gate: open.
Shared tool cooldowns: none.
Shared prepared counter: (empty)
Dish progress:
- dish_1: 0/3 ingredients prepared, meal_prepared=False, meal_eaten=False
- dish_2: 0/3 ingredients prepared, meal_prepared=False, meal_eaten=False
Shared steps remaining: 116
Valid Actions are listed below."""

INITIAL_ACTIONS = [
    "look around", "inventory", "read cookbook", "go to pantry", "go to garden", "go to supermarket",
    "go to hallway", "move north", "move east", "move west", "take knife", "take white onion",
    "take yellow bell pepper",
]

AFTER_STEP_3 = """You are in the kitchen.
Visible objects: yellow bell pepper
Shared kitchen gate: open.
Shared tool cooldowns: none.
Shared prepared counter: white onion
Dish progress:
- dish_1: 1/3 ingredients prepared, meal_prepared=False, meal_eaten=False
- dish_2: 0/3 ingredients prepared, meal_prepared=False, meal_eaten=False
Shared steps remaining: 113
Valid Actions are listed below."""

FINAL_OBSERVATION = """You are in the pantry.
Visible objects: (none)
Shared kitchen gate: open.
Shared tool cooldowns: none.
Shared prepared counter: black pepper, flour, olive oil, salt, white onion, yellow bell pepper
Dish progress:
- dish_1: 3/3 ingredients prepared, meal_prepared=True, meal_eaten=True
- dish_2: 3/3 ingredients prepared, meal_prepared=True, meal_eaten=True
Shared steps remaining: 101
Valid Actions are listed below."""


def test_worked_example_observation_text_exact():
    world = make_world(EASY0)
    obs, infos = world.observe_full("root")
    assert obs == INITIAL_OBSERVATION
    assert infos["validActions"] == INITIAL_ACTIONS
    assert infos["inventory"] == "(empty)"
    assert set(infos) == {"validActions", "inventory", "score", "tasksuccess", "taskfailure", "done", "steps",
                          "remaining_shared_steps", "agent_location", "completed_dishes", "total_dishes"}
    r = world.step("root", "take white onion")
    assert r.infos["inventory"] == "white onion" and "white onion" not in r.observation.splitlines()[1]
    assert r.infos["validActions"][-2:] == ["dice white onion", "cook white onion on grill"]
    r = world.step("root", "dice white onion")
    assert r.infos["validActions"][-1] == "cook white onion on grill"
    assert "dice white onion" not in r.infos["validActions"]
    r = world.step("root", "cook white onion on grill")
    assert r.observation == AFTER_STEP_3
    assert r.infos["inventory"] == "(empty)"
    for action in WORKED_SOLUTION[3:]:
        r = world.step("root", action)
        assert r.error == "", action
    assert r.observation == FINAL_OBSERVATION
    assert r.done and r.infos["tasksuccess"] and r.infos["score"] == 1.0 and r.infos["reward"] == 1.0
    assert r.infos["steps"] == 15 and r.infos["remaining_shared_steps"] == 101
    assert r.infos["completed_dishes"] == 2 and r.infos["total_dishes"] == 2
    assert world.check("root").success


def test_rejected_actions_count_and_change_nothing():
    world = make_world(EASY0)
    digest = world.digest()
    for bad in ["take salt", "Take white onion", "take  white onion", "place salt on counter", "dice white onion",
                "open door", "go to kitchen", "prepare dish_1", "", "move south"]:
        r = world.step("root", bad)
        assert r.error == INVALID_ACTION and r.observation == world.observe("root")
    assert world.steps == 10 and not world.done
    world.steps = 0
    assert world.digest() == digest
    assert [e["accepted"] for e in world.get_events()] == [False] * 10


def test_free_forms_accepted_as_noops_and_cost_a_step():
    world = make_world(EASY0)
    for form in ["Look  Around", "INVENTORY", "view inventory", " check   inventory ", "read cookbook", "take knife"]:
        r = world.step("root", form)
        assert r.error == ""
    assert world.steps == 6 and world.inventory == [] and not any(world.collected)


def test_compass_moves_are_absolute_aliases():
    world = make_world(EASY0)
    world.step("root", "move north")
    assert world.agent_locations["root"] == "pantry"
    assert "move north" not in world.valid_actions("root")
    world.step("root", "move east")
    assert world.agent_locations["root"] == "garden"
    world.step("root", "move west")
    assert world.agent_locations["root"] == "supermarket"


def test_raw_items_go_straight_to_counter_and_gate_rules():
    task = TASKS["dependency_gate_easy_0024"]  # includeDoors forced on; dish_2 behind the gate
    world = make_world(task)
    assert not world.gate_open
    world.step("root", "go to pantry")
    obs = world.observe("root")
    assert "Shared kitchen gate: closed." in obs
    # black pepper (dish_1) is visible, salt and olive oil (dish_2, gated) are not, nor takeable.
    assert obs.splitlines()[1] == "Visible objects: black pepper"
    assert world.step("root", "take salt").error == INVALID_ACTION
    world.step("root", "take black pepper")
    assert world.ready[world.c.index["black pepper"]] and world.inventory == []
    world.step("root", "open door")
    assert world.gate_open and "open door" not in world.valid_actions("root")
    assert world.observe("root").splitlines()[1] == "Visible objects: salt, olive oil"


def test_cooldown_arithmetic_and_capacity_one():
    task = TASKS["resource_constrained_hard_0022"]  # capacity 1, cooldown 1
    world = make_world(task)
    assert world.c.capacity == 1 and world.c.cooldown == 1
    world.step("root", "open door")
    world.step("root", "take red apple")
    acts = world.valid_actions("root")
    assert not any(a.startswith("take ") and a != "take knife" for a in acts)  # inventory full
    assert "chop red apple" in acts and "cook red apple on grill" in acts
    r = world.step("root", "chop red apple")
    assert "Shared tool cooldowns: knife:1." in r.observation
    assert world.cooldowns == {"knife": 1}
    r = world.step("root", "look around")
    assert "Shared tool cooldowns: none." in r.observation
    r = world.step("root", "cook red apple on grill")
    assert "grill:1" in r.observation and world.ready[world.c.index["red apple"]]
    assert world.inventory == []


def test_cooling_tool_not_offered_and_rejected():
    row = copy.deepcopy(TASKS["resource_constrained_hard_0022"].to_manifest_row())
    row["generation_properties"]["parallelism"]["resource_capacity"] = {"inventory": 2}
    world = make_world(row)
    assert world.c.capacity == 2
    world.step("root", "open door")
    world.step("root", "take carrot")
    world.step("root", "take red apple")
    assert world.step("root", "take red potato").error == INVALID_ACTION  # inventory full at 2
    world.step("root", "dice carrot")
    assert world.cooldowns == {"knife": 1}
    assert "chop red apple" not in world.valid_actions("root")
    assert world.step("root", "chop red apple").error == INVALID_ACTION  # knife cooling; step still counted
    assert world.cooldowns == {} and world.steps == 6
    assert "chop red apple" in world.valid_actions("root")
    world.step("root", "cook carrot on grill")
    assert "cook red apple on grill" not in world.valid_actions("root")
    assert "chop red apple" in world.valid_actions("root")  # tools are independent


def test_budget_done_but_steps_still_accepted():
    world = make_world(EASY0)
    for _ in range(EASY0.max_steps - 1):
        assert not world.step("root", "look around").done
    r = world.step("root", "look around")
    assert r.done and r.infos["remaining_shared_steps"] == 0 and not r.infos["tasksuccess"]
    r = world.step("root", "take white onion")
    assert r.error == "" and world.steps == EASY0.max_steps + 1 and r.infos["remaining_shared_steps"] == 0


def test_capacity_rules_per_family():
    caps = {key: make_world(t).c.capacity for key, t in TASKS.items()}
    assert caps["multi_dish_fork_join_easy_0000"] == 0  # limitInventorySize 0 -> unlimited
    assert caps["load_balanced_medium_0022"] == 1  # limitInventorySize taken literally
    assert caps["resource_constrained_hard_0022"] == 1  # resource_capacity.inventory overrides


def test_rooms_and_subagent_location():
    world = make_world(TASKS["conflict_hard_0022"])
    assert len(world.c.rooms) == 11 and world.c.rooms[-1] == "courtyard"
    world.step("root", "go to garden")
    world.add_agent("root/subagent-0-0")
    assert world.agent_locations["root/subagent-0-0"] == "garden"
    world.step("root/subagent-0-0", "go to attic")
    world.add_agent("root/subagent-0-0/subagent-1-0")  # a grandchild starts at the root's location
    assert world.agent_locations["root/subagent-0-0/subagent-1-0"] == "garden"
    assert world.observe("someone-new").startswith("You are in the kitchen.")


def test_observing_never_changes_state():
    world = make_world(TASKS["conflict_hard_0022"])
    digest = world.digest()
    for agent in ("root", "stranger", "root/subagent-0-0"):
        world.observe(agent)
        world.observe_full(agent)
        world.valid_actions(agent)
    world.get_object_tree()
    world.check("root")
    assert world.digest() == digest and world.steps == 0 and world.get_events() == []
