"""A task compiled for fast stepping: immutable tables shared by a world and all of its forks.

Everything that never changes during an episode is computed once here: rooms, ingredient order, expected
preparation sets, gating, every command string the world may ever offer and the effect each one has. The world
then only flips flags and looks commands up in dicts (docs/design/textworld.md §5, §7).
"""

from __future__ import annotations

from typing import Any

from envs_py.textworld_sync import catalog
from envs_py.textworld_sync.tasks import TaskSpec, as_task_spec

RULES = ("reference", "full")

# Effect kinds (first element of an effect tuple).
NOOP, GO, OPEN, TAKE, CUT, COOK, PREPARE, EAT = range(8)


class CompiledTask:
    """Static tables of one task under one rules option (`reference` or `full`)."""

    __slots__ = (
        "task", "rules", "rooms", "limit", "cooldown", "capacity", "dish_ids", "dish_items", "names", "index",
        "dish_of", "expected", "initial_actual", "trivial", "gated", "start", "room_items", "moves", "take_cmd",
        "prep_cmds", "prepare_cmd", "eat_cmd", "effects", "cook_output", "recipes",
    )

    def __init__(self, task: Any, rules: str = "reference"):
        if rules not in RULES:
            raise ValueError(f"rules must be one of {RULES}, got {rules!r}")
        spec: TaskSpec = as_task_spec(task)
        params = spec.params
        par = spec.parallelism
        self.task = spec
        self.rules = rules
        self.rooms = catalog.task_rooms(params.get("numLocations"))
        self.limit = spec.max_steps
        self.cooldown = int((par.get("mechanisms") or {}).get("tool_cooldown_steps", 0) or 0)
        # Capacity is limitInventorySize taken literally (0 = unlimited) unless resource_capacity.inventory
        # overrides it (docs/design/textworld.md §4, §15 item 4).
        capacity = int(params.get("limitInventorySize", 0) or 0)
        resource = par.get("resource_capacity") or {}
        if isinstance(resource, dict) and "inventory" in resource:
            capacity = int(resource["inventory"])
        self.capacity = capacity
        gated_dishes = {
            str(dep.get("to")) for dep in par.get("dependencies") or []
            if isinstance(dep, dict) and dep.get("from") == "gate_1"
        }
        self.dish_ids: list[str] = []
        self.dish_items: list[list[int]] = []
        self.recipes: list[list[tuple[str, tuple[str, ...]]]] = []
        self.names: list[str] = []
        self.dish_of: list[int] = []
        self.expected: list[frozenset] = []
        self.start: list[str] = []
        self.gated: list[bool] = []
        for d, dish in enumerate(spec.dishes):
            dish_id = str(dish["dish_id"])
            self.dish_ids.append(dish_id)
            items, recipe = [], []
            for ing in dish.get("recipe", []):
                name = str(ing["name"])
                prep = tuple(str(p) for p in ing.get("preparation") or ())
                items.append(len(self.names))
                recipe.append((name, prep))
                self.names.append(name)
                self.dish_of.append(d)
                self.expected.append(frozenset(prep) or catalog.TRIVIAL)
                self.start.append(catalog.start_room(ing.get("candidate_source_locations")))
                self.gated.append(dish_id in gated_dishes)
            self.dish_items.append(items)
            self.recipes.append(recipe)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{spec.task_id}: ingredient names must be unique within a task")
        self.index = {name: i for i, name in enumerate(self.names)}
        self.trivial = [exp <= catalog.TRIVIAL for exp in self.expected]
        if rules == "reference":
            self.initial_actual = [exp & catalog.TRIVIAL for exp in self.expected]
        else:
            self.initial_actual = [catalog.TRIVIAL for _ in self.expected]
        room_set = set(self.rooms)
        self.room_items = {
            room: tuple(i for i, start in enumerate(self.start) if start == room) for room in self.rooms
        }
        # Movement commands offered in each room, in offer order (docs/design/textworld.md §7 items 2-3).
        self.moves: dict[str, tuple[str, ...]] = {}
        self.effects: dict[str, tuple] = {"look around": (NOOP,), "inventory": (NOOP,),
                                          "read cookbook": (NOOP,), "take knife": (NOOP,), "open door": (OPEN,)}
        for room in self.rooms:
            cmds = [f"go to {other}" for other in self.rooms if other != room]
            cmds += [f"move {way}" for way, target in catalog.COMPASS if target in room_set and target != room]
            self.moves[room] = tuple(cmds)
        for other in self.rooms:
            self.effects[f"go to {other}"] = (GO, other)
        for way, target in catalog.COMPASS:
            if target in room_set:
                self.effects[f"move {way}"] = (GO, target)
        self.take_cmd = [f"take {name}" for name in self.names]
        for i, cmd in enumerate(self.take_cmd):
            self.effects[cmd] = (TAKE, i)
        # Per ingredient: (command, preparation word or None, tool) in offer order (docs/design/textworld.md §7 item 7).
        self.prep_cmds: list[tuple[tuple[str, str, str], ...]] = []
        self.cook_output: list[dict[str, frozenset]] = []
        for i, name in enumerate(self.names):
            exp = self.expected[i]
            cmds: list[tuple[str, str, str]] = []
            outputs: dict[str, frozenset] = {}
            if rules == "reference":
                cmds += [(f"{verb} {name}", word, "knife") for word, verb in catalog.CUTS if word in exp]
                seen_tools: set[str] = set()
                for word, tool in catalog.COOKS:
                    if word in exp and tool not in seen_tools:
                        seen_tools.add(tool)
                        cmds.append((f"cook {name} {catalog.TOOL_PHRASE[tool]}", word, tool))
                        # A tool adds every expected preparation it produces.
                        outputs[tool] = frozenset(w for w, t in catalog.COOKS if t == tool and w in exp)
            else:
                cmds += [(f"{verb} {name}", word, "knife") for word, verb in catalog.CUTS]
                for tool in catalog.COOK_TOOLS:
                    alt = catalog.TOOL_ALTERNATE.get(tool)
                    word = alt if alt in exp else catalog.TOOL_DEFAULT[tool]
                    cmds.append((f"cook {name} {catalog.TOOL_PHRASE[tool]}", word, tool))
                    outputs[tool] = frozenset((word,))
            for cmd, word, tool in cmds:
                self.effects[cmd] = (CUT, i, word) if tool == "knife" else (COOK, i, tool)
            self.prep_cmds.append(tuple(cmds))
            self.cook_output.append(outputs)
        self.prepare_cmd = [f"prepare {dish_id}" for dish_id in self.dish_ids]
        self.eat_cmd = [f"eat {dish_id}" for dish_id in self.dish_ids]
        for d in range(len(self.dish_ids)):
            self.effects[self.prepare_cmd[d]] = (PREPARE, d)
            self.effects[self.eat_cmd[d]] = (EAT, d)

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def task_dishes(self) -> list[dict]:
        """Returns the dishes in the scorer's input form: [{dish_id, recipe: [{name, preparation}]}]."""
        return [
            {"dish_id": dish_id, "recipe": [{"name": n, "preparation": list(p)} for n, p in recipe]}
            for dish_id, recipe in zip(self.dish_ids, self.recipes)
        ]
