"""The TextWorld-Sync world: one shared state for every agent of a tree (docs/design/textworld.md §5-§9).

`World` implements the `envs_py.core.Env` protocol synchronously and without locking; `Coordinator`
(coordinator.py) wraps it with the lock that makes each action one atomic commit for concurrent agents. Static
task tables live in a `CompiledTask` shared by a world and all of its forks, so a fork only copies a few small lists.
"""

from __future__ import annotations

import hashlib
from typing import Any

from envs_py.core import CheckResult, StepResult
from envs_py.textworld_sync import observation
from envs_py.textworld_sync.compiled import COOK, CUT, EAT, GO, OPEN, PREPARE, TAKE, CompiledTask
from envs_py.textworld_sync.scorer import failure_reason, score_task

ROOT = "root"
INVALID_ACTION = "Action is not valid in the current composite world state."
# Always accepted (after lower-casing and collapsing whitespace), as no-ops (docs/design/textworld.md §6.2 item 2).
FREE_FORMS = frozenset({"look around", "inventory", "view inventory", "check inventory"})
_STATE = ("actual", "collected", "ready", "deleted", "inventory", "ready_count", "meal_prepared", "meal_eaten",
          "gate_open", "cooldowns", "steps", "done", "failure", "invalid", "agent_locations", "events")


class World:
    """Mutable shared state of one task plus the step / observe / fork / commit / check / digest operations."""

    __slots__ = ("c",) + _STATE

    def __init__(self, task: Any, rules: str = "reference"):
        self.c = task if isinstance(task, CompiledTask) else CompiledTask(task, rules)
        self._init_state()

    # ------------------------------------------------------------------ lifecycle

    def _init_state(self) -> None:
        c = self.c
        n = len(c.names)
        self.actual = list(c.initial_actual)
        self.collected = [False] * n
        self.ready = [False] * n
        self.deleted = [False] * n
        self.inventory: list[int] = []
        self.ready_count = [0] * len(c.dish_ids)
        self.meal_prepared = [False] * len(c.dish_ids)
        self.meal_eaten = [False] * len(c.dish_ids)
        # The gate starts closed iff includeDoors (docs/design/textworld.md §5.3).
        self.gate_open = not bool(int(c.task.params.get("includeDoors", 0) or 0))
        self.cooldowns: dict[str, int] = {}
        self.steps = 0
        self.done = False
        self.failure = False
        self.invalid = False
        self.agent_locations: dict[str, str] = {}
        self.events: list[dict] = []

    def reset(self, task: Any = None) -> str:
        """Starts the task afresh (a new task if given); returns the root agent's initial observation."""
        if task is not None:
            self.c = CompiledTask(task, self.c.rules)
        self._init_state()
        self.agent_locations[ROOT] = "kitchen"
        return self.observe(ROOT)

    @property
    def task(self):
        return self.c.task

    @property
    def rules(self) -> str:
        return self.c.rules

    @property
    def limit(self) -> int:
        return self.c.limit

    def add_agent(self, agent_id: str) -> str:
        """Registers an agent at the root's current location (unless known); returns its location (docs/design/textworld.md §10.3)."""
        loc = self.agent_locations.get(agent_id)
        if loc is None:
            loc = self.agent_locations.get(ROOT, "kitchen")
            self.agent_locations[agent_id] = loc
        return loc

    # ------------------------------------------------------------------ rules

    def valid_actions(self, agent_id: str) -> list[str]:
        """Returns the agent's valid-action list, in the order of docs/design/textworld.md §7."""
        return self._valid(self.agent_locations.get(agent_id, "kitchen"))

    def _valid(self, room: str) -> list[str]:
        c = self.c
        acts = ["look around", "inventory", "read cookbook"]
        acts += c.moves[room]
        gate_open = self.gate_open
        if not gate_open:
            acts.append("open door")
        if room == "kitchen":
            acts.append("take knife")
        inv = self.inventory
        if c.capacity == 0 or len(inv) < c.capacity:
            collected, gated, take_cmd = self.collected, c.gated, c.take_cmd
            for i in c.room_items[room]:
                if not collected[i] and (gate_open or not gated[i]):
                    acts.append(take_cmd[i])
        if inv:
            cooling = self.cooldowns
            actual = self.actual
            if c.rules == "reference":
                for i in inv:
                    have = actual[i]
                    for cmd, word, tool in c.prep_cmds[i]:
                        if word not in have and tool not in cooling:
                            acts.append(cmd)
            else:
                for i in inv:
                    have = actual[i]
                    can_cut, can_cook = "uncut" in have, "raw" in have
                    for cmd, word, tool in c.prep_cmds[i]:
                        if (can_cut if tool == "knife" else can_cook) and tool not in cooling:
                            acts.append(cmd)
        prepared = self.meal_prepared
        for d, items in enumerate(c.dish_items):
            if not prepared[d] and self.ready_count[d] == len(items):
                acts.append(c.prepare_cmd[d])
        eaten = self.meal_eaten
        for d in range(len(prepared)):
            if prepared[d] and not eaten[d]:
                acts.append(c.eat_cmd[d])
        return acts

    def _apply(self, agent_id: str, effect: tuple) -> None:
        kind = effect[0]
        c = self.c
        if kind == GO:
            self.agent_locations[agent_id] = effect[1]
        elif kind == TAKE:
            i = effect[1]
            self.collected[i] = True
            if c.trivial[i]:
                # Raw/uncut items go straight to the counter and never occupy capacity.
                self._mark_ready(i)
            else:
                self.inventory.append(i)
        elif kind == CUT or kind == COOK:
            i = effect[1]
            have = self.actual[i]
            if kind == CUT:
                have = (have - {"uncut"}) | {effect[2]}
                tool = "knife"
            else:
                tool = effect[2]
                produced = c.cook_output[i][tool]
                have = (have | produced) if c.rules == "reference" else (have - {"raw"}) | produced
            self.actual[i] = have
            if c.cooldown > 0:
                self.cooldowns[tool] = c.cooldown + 1
            if have == c.expected[i]:
                self.inventory.remove(i)
                self._mark_ready(i)
            elif c.rules == "full" and not self.invalid and (have - {"raw", "uncut"}) - c.expected[i]:
                self.invalid = True  # a wrong preparation is irreversible: the task has failed
        elif kind == OPEN:
            self.gate_open = True
        elif kind == PREPARE:
            self.meal_prepared[effect[1]] = True
        elif kind == EAT:
            self.meal_eaten[effect[1]] = True

    def _mark_ready(self, i: int) -> None:
        self.ready[i] = True
        self.ready_count[self.c.dish_of[i]] += 1

    def success(self) -> bool:
        """Returns True iff every dish is eaten (equivalent to the scorer's PASS: eating needs every item ready)."""
        return bool(self.meal_eaten) and all(self.meal_eaten)

    # ------------------------------------------------------------------ Env protocol

    def step(self, agent_id: str, action: Any) -> StepResult:
        """Validates, applies and counts one action of `agent_id` (docs/design/textworld.md §6.2); returns its StepResult.

        A rejected action changes nothing but still costs a global step and advances cooldowns; the returned
        `error` carries the reason, the observation does not (as in the reference)."""
        locs = self.agent_locations
        before = locs.get(agent_id)
        if before is None:
            before = locs[agent_id] = "kitchen"
        action = str(action).strip()
        accepted = action in self._valid(before)
        if not accepted and " ".join(action.lower().split()) in FREE_FORMS:
            accepted = True
        if accepted:
            effect = self.c.effects.get(action)
            if effect is not None:
                self._apply(agent_id, effect)
        self.steps += 1
        success = self.success()
        if success:
            self.done = True
        if self.invalid:
            self.failure = self.done = True
        if self.steps >= self.c.limit:
            self.done = True
        cooling = self.cooldowns
        if cooling:
            for tool, left in list(cooling.items()):
                if left <= 1:
                    del cooling[tool]
                else:
                    cooling[tool] = left - 1
        reward = 1.0 if success else 0.0
        obs, infos = self._observe(agent_id)
        infos["reward"] = reward
        error = "" if accepted else INVALID_ACTION
        self.events.append({
            "sequence": len(self.events) + 1, "agent_id": agent_id, "action": action, "accepted": accepted,
            "reward": reward, "done": self.done, "observation": obs, "before_location": before,
            "after_location": locs[agent_id], "error": error,
        })
        return StepResult(observation=obs, done=self.done, error=error, infos=infos)

    def observe(self, agent_id: str) -> str:
        """Returns the agent's current observation text (docs/design/textworld.md §8)."""
        return self._observe(agent_id)[0]

    def observe_full(self, agent_id: str) -> tuple[str, dict]:
        """Returns (observation text, infos dict) for the agent (docs/design/textworld.md §8)."""
        return self._observe(agent_id)

    def _observe(self, agent_id: str) -> tuple[str, dict]:
        # Observing never changes state: an unknown agent is shown the kitchen until it acts (docs/design/textworld.md §6.2 item 1).
        return observation.render(self, self.agent_locations.get(agent_id, "kitchen"))

    def fork(self) -> "World":
        """Returns a fully isolated copy of this world (static task tables are shared, being immutable)."""
        other = object.__new__(World)
        other.c = self.c
        other.actual = self.actual.copy()
        other.collected = self.collected.copy()
        other.ready = self.ready.copy()
        other.deleted = self.deleted.copy()
        other.inventory = self.inventory.copy()
        other.ready_count = self.ready_count.copy()
        other.meal_prepared = self.meal_prepared.copy()
        other.meal_eaten = self.meal_eaten.copy()
        other.gate_open = self.gate_open
        other.cooldowns = self.cooldowns.copy()
        other.steps = self.steps
        other.done = self.done
        other.failure = self.failure
        other.invalid = self.invalid
        other.agent_locations = self.agent_locations.copy()
        other.events = self.events.copy()
        return other

    def commit(self, branch: "World") -> None:
        """Adopts `branch`'s state (a fork of the same task) as this world's state."""
        if not isinstance(branch, World) or branch.c.task_id != self.c.task_id or branch.c.rules != self.c.rules:
            raise ValueError("commit needs a fork of the same task under the same rules")
        clone = branch.fork()
        for name in _STATE:
            setattr(self, name, getattr(clone, name))

    def check(self, agent_id: str = ROOT) -> CheckResult:
        """Returns the programmatic label of the whole task (shared by every agent) with the scorer report."""
        report = self.score_report()
        if self.failure and not report["task_failure"]:
            report["task_failure"] = True
        return CheckResult(success=bool(report["task_success"]), reason=failure_reason(report), details=report)

    def score_report(self) -> dict:
        """Returns the scorer's report for the current state (docs/design/textworld.md §9)."""
        return score_task(self.c.task_dishes(), self.get_object_tree())

    def digest(self) -> str:
        """Returns a hex digest of the whole world state (the event log, being history, is not included)."""
        c = self.c
        parts = (
            c.task_id, c.rules, [sorted(a) for a in self.actual], self.collected, self.ready, self.deleted,
            self.inventory, self.meal_prepared, self.meal_eaten, self.gate_open, sorted(self.cooldowns.items()),
            self.steps, self.done, self.failure, self.invalid, sorted(self.agent_locations.items()),
        )
        return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()

    # ------------------------------------------------------------------ views for scorer and logs

    def get_object_tree(self) -> dict:
        """Returns the object tree of docs/design/textworld.md §8 (the scorer's input and a log record)."""
        c = self.c
        dishes = {}
        for d, dish_id in enumerate(c.dish_ids):
            dishes[dish_id] = {
                "ingredients": {
                    c.names[i]: {"collected": self.collected[i], "deleted": self.deleted[i],
                                 "preparation": sorted(self.actual[i]), "ready": self.ready[i]}
                    for i in c.dish_items[d]
                },
                "meal_prepared": self.meal_prepared[d], "meal_eaten": self.meal_eaten[d],
            }
        return {
            "dishes": dishes, "inventory": [c.names[i] for i in self.inventory],
            "prepared_on_counter": observation.counter_names(self), "agent_locations": dict(self.agent_locations),
            "steps": self.steps, "gate_open": self.gate_open, "tool_cooldowns": dict(self.cooldowns),
        }

    def get_events(self) -> list[dict]:
        """Returns the event log in commit order (docs/design/textworld.md §6.4)."""
        return list(self.events)

    def inventory_text(self) -> str:
        """Returns the shared inventory as the `infos` string: ', '-joined names or '(empty)'."""
        return observation.inventory_text(self)


def make_world(task: Any, rules: str = "reference") -> World:
    """Returns a reset World for `task` (a TaskSpec, a Task with a row payload, or a row dict) under `rules`.

    This is the factory to register in the env workers' registry under the name "textworld_sync"."""
    world = World(task, rules)
    world.reset()
    return world
