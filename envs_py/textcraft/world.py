"""The TextCraft world of one agent tree: the shared inventory, per-agent records, tools, fork/commit/digest.

Every agent of a tree uses the same inventory object; each agent's record keeps a snapshot of the inventory at
its start, so the checker measures net increases. The world is plain Python state: it runs in an env worker
process, and sandboxed cells reach it only through :meth:`TextCraftWorld.call_tool` (an RPC the world validates).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

from envs_py.core import CheckResult, StepResult, Task
from envs_py.textcraft import tools
from envs_py.textcraft.checker import AgentRecord, check_agent
from envs_py.textcraft.recipes import RecipeBook, recipe_book
from envs_py.textcraft.tasks import DEFAULT_MAX_STEPS, goal_text

ROOT = "root"
SYNC_TOOLS = ("get_info", "view_inventory", "craft", "finish")
ASYNC_TOOLS = ("launch_subagent",)
MAX_SUBAGENT_DEPTH = 3
MAX_TARGETS = 16  # distinct items one launch may ask for (a task has one or a few)
MAX_TARGET_COUNT = 10_000  # a count past any inventory the worlds generate; keeps the goal text bounded
CONTEXT_SEP = "\n\nContext provided from parent agent: "


def _shown(name: str, limit: int = 60) -> str:
    """A model-written name as an error text quotes it: repr (escapes visible), cut to ``limit`` characters."""
    text = repr(name)
    return text if len(text) <= limit else text[:limit] + "...'"


class TextCraftWorld:
    """One tree's world. ``max_steps`` is the runtime's per-agent cell budget (default 20), used only in texts."""

    sync_tools = SYNC_TOOLS
    async_tools = ASYNC_TOOLS

    def __init__(self, book: RecipeBook, inventory: Mapping[str, int] | None = None,
                 max_steps: int = DEFAULT_MAX_STEPS, max_subagent_depth: int = MAX_SUBAGENT_DEPTH):
        self.book = book
        self.inventory: dict[str, int] = dict(inventory or {})
        self.agents: dict[str, AgentRecord] = {}
        self.max_steps = int(max_steps)
        self.max_subagent_depth = int(max_subagent_depth)
        self.task: Task | None = None

    @classmethod
    def from_task(cls, task: Task, max_steps: int = DEFAULT_MAX_STEPS) -> "TextCraftWorld":
        """Returns a world reset to ``task`` (root agent registered as ``"root"``)."""
        world_cfg = task.payload.get("world") or {}
        book = recipe_book(int(world_cfg.get("seed", 42)), int(world_cfg.get("items_per_domain_tier", 25)))
        w = cls(book, max_steps=max_steps)
        w.reset(task)
        return w

    # -- Env protocol ----------------------------------------------------------------------------------------
    def reset(self, task: Task) -> str:
        """Resets the world to the task's inventory with a fresh root agent; returns the root's task string."""
        self.task = task
        self.inventory = dict(task.payload["initial_inventory"])
        self.agents = {}
        self.add_agent(ROOT, task.payload["target_items"], None)
        return self.observe(ROOT)

    def observe(self, agent_id: str) -> str:
        """Returns the agent's task string: its goal and its step budget."""
        rec = self.agents.get(agent_id)
        if rec is None:
            return f"Error: unknown agent {agent_id!r}"
        goal = self.task.goal if (agent_id == ROOT and self.task is not None) else goal_text(rec.targets)
        return f"Your Goal: {goal}\nBudget: You have a total budget of {self.max_steps} steps to complete this task."

    def step(self, agent_id: str, action: Any) -> StepResult:
        """Applies one tool call ``(name, args, kwargs)``; returns its value in ``infos["value"]`` and as text.

        A model's *cell* (many tool calls) is run by :class:`envs_py.textcraft.session.TextCraftSession`; each
        of its tool calls arrives here (via ``call_tool``) as one validated action.
        """
        try:
            name, args, kwargs = action
        except (TypeError, ValueError):
            return StepResult("", error="Error: an action is a (tool name, args, kwargs) triple")
        value = self.call_tool(agent_id, name, args, kwargs)
        text = value if isinstance(value, str) else repr(value)
        return StepResult(text, done=(name == "finish"), infos={"value": value})

    def fork(self) -> "TextCraftWorld":
        """Returns an isolated copy (inventory and agent records copied; the immutable recipe book shared)."""
        w = TextCraftWorld.__new__(TextCraftWorld)
        w.book = self.book
        w.inventory = self.inventory.copy()
        w.agents = {k: r.copy() for k, r in self.agents.items()}
        w.max_steps = self.max_steps
        w.max_subagent_depth = self.max_subagent_depth
        w.task = self.task
        return w

    def commit(self, branch: "TextCraftWorld") -> None:
        """Makes this world's state equal the branch's; the inventory object is updated in place (shared)."""
        self.inventory.clear()
        self.inventory.update(branch.inventory)
        self.agents = {k: r.copy() for k, r in branch.agents.items()}

    def check(self, agent_id: str = ROOT) -> CheckResult:
        """Returns the success label of one agent (root or sub-agent)."""
        rec = self.agents.get(agent_id)
        if rec is None:
            return CheckResult(False, f"unknown agent {agent_id!r}")
        return check_agent(rec, self.inventory)

    def digest(self) -> str:
        """Returns a sha256 of the inventory and every agent record (equal digests = equal states)."""
        inventory = sorted((k, v) for k, v in self.inventory.items() if v)
        state = [inventory, [r.state() for _, r in sorted(self.agents.items())]]
        return hashlib.sha256(json.dumps(state, separators=(",", ":")).encode()).hexdigest()

    # -- agents ----------------------------------------------------------------------------------------------
    def add_agent(self, agent_id: str, targets: Mapping[str, int], parent_id: str | None) -> AgentRecord:
        """Registers an agent with a snapshot of the shared inventory; returns its record."""
        parent = self.agents.get(parent_id) if parent_id is not None else None
        rec = AgentRecord(str(agent_id), {str(k): int(v) for k, v in targets.items()}, dict(self.inventory),
                          parent_id, 0 if parent is None else parent.depth + 1)
        self.agents[rec.agent_id] = rec
        return rec

    def subagent_request(self, agent_id: str, targets: Any, context: Any = "") -> dict:
        """Validates a ``launch_subagent(targets, context)`` call, once and strictly; returns
        ``{"goal", "targets", "context", "depth"}`` or ``{"error": text}`` (the string the calling cell receives).

        ``targets`` must be a non-empty dict mapping item names this world knows (exactly: no case-folding, no
        trimming) to ints in ``1..MAX_TARGET_COUNT`` (a bool is not a count), at most ``MAX_TARGETS`` of them;
        ``context`` a string. The returned targets are a copy of the validated dict, and the goal text is rendered
        from them (never parsed back), so the child is checked on exactly what the parent asked for.
        """
        rec = self.agents.get(agent_id)
        if rec is None:
            return {"error": f"Error: unknown agent {agent_id!r}"}
        error = self.targets_error(targets)
        if error is not None:
            return {"error": error}
        if not isinstance(context, str):
            return {"error": f"Error: launch_subagent context must be a string, got {type(context).__name__}"}
        targets = {str(k): int(v) for k, v in targets.items()}
        goal = goal_text(targets)
        if context:
            goal += CONTEXT_SEP + context
        if rec.depth + 1 > self.max_subagent_depth:
            return {"error": f"Not enough budget to launch subagent for goal {goal}. Launching a subagent from depth "
                             f"{rec.depth} would exceed the maximum allowed depth of {self.max_subagent_depth}. The "
                             "maximum depth for hierarchical delegation has been reached. You should perform the "
                             "task yourself instead of delegating."}
        return {"goal": goal, "targets": targets, "context": context, "depth": rec.depth + 1}

    def targets_error(self, targets: Any) -> str | None:
        """Returns the ``Error: ...`` text a malformed ``launch_subagent`` targets argument gets, or None when it is
        a non-empty dict of known item names (exact spelling) to positive int counts (not bools)."""
        if not isinstance(targets, dict) or not targets:
            return "Error: launch_subagent targets must be a non-empty dict of {item_name: count}"
        if len(targets) > MAX_TARGETS:
            return f"Error: launch_subagent takes at most {MAX_TARGETS} targets, got {len(targets)}"
        for k, v in targets.items():
            if not isinstance(k, str):
                return f"Error: launch_subagent target names must be strings, got {type(k).__name__}"
            if not (self.book.can_craft(k) or self.book.is_base_item(k)):
                return (f"Error: launch_subagent target {_shown(k)} is not a known item (names are exact: "
                        "check them with get_info)")
            if isinstance(v, bool) or not isinstance(v, int):
                return f"Error: launch_subagent count for {k} must be an int, got {type(v).__name__}"
            if not 0 < v <= MAX_TARGET_COUNT:
                got = v if v.bit_length() <= 64 else "a larger number"
                return f"Error: launch_subagent count for {k} must be between 1 and {MAX_TARGET_COUNT}, got {got}"
        return None

    # -- tools -------------------------------------------------------------------------------------------------
    def call_tool(self, agent_id: str, name: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Validates and applies one synchronous tool call of an agent; returns the tool's value (errors as text)."""
        fn = self.tools(agent_id).get(name) if isinstance(name, str) else None
        if fn is None:
            return f"Error: unknown tool {name!r}"
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs or {}, dict):
            return "Error: malformed tool call"
        try:
            return fn(*args, **(kwargs or {}))
        except TypeError as e:  # wrong arity or keyword: report like Python would, without a host traceback
            return f"Error: {name}() {str(e).split('() ', 1)[-1]}"

    def tools(self, agent_id: str) -> dict[str, Callable[..., Any]]:
        """Returns the synchronous tools bound to one agent (name -> callable), as a cell sees them."""
        book = self.book

        def get_info(items):
            return tools.get_info(book, self.inventory, items)

        def view_inventory():
            return tools.view_inventory(self.inventory)

        def craft(ingredients, target):
            return tools.craft(book, self.inventory, ingredients, target)

        def finish(message=""):
            rec = self.agents.get(agent_id)
            text = message if isinstance(message, str) else str(message)
            if rec is not None:
                rec.finish_message = text
            return text

        return {"get_info": get_info, "view_inventory": view_inventory, "craft": craft, "finish": finish}

    def finished(self, agent_id: str) -> bool:
        """Returns whether the agent has called finish() (its episode ends after the current cell)."""
        rec = self.agents.get(agent_id)
        return rec is not None and rec.finish_message is not None
