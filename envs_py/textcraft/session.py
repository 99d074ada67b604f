"""One TextCraft tree as hosted by an env worker: the world plus one sandbox per agent.

``run_cell`` executes an agent's code in that agent's sandbox; the cell's tool calls come back as RPCs and are
validated and applied here, against the world. ``launch_subagent`` is validated once, strictly
(``TextCraftWorld.subagent_request``: known item names to positive ints, the depth limit) and then handed to the
runtime's ``launch`` callback, whose string is the call's return value; a malformed request is the error string the
cell receives, and ``run_cell`` counts them (``invalid_launches``, the first errors in ``invalid_launch_errors``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable

from envs_py.core import CheckResult, Task
from envs_py.sandbox import Limits, Sandbox, SandboxPool
from envs_py.textcraft.tasks import DEFAULT_MAX_STEPS
from envs_py.textcraft.world import ASYNC_TOOLS, SYNC_TOOLS, TextCraftWorld

Launch = Callable[[str, dict], Awaitable[str]]


class TextCraftSession:
    """A tree's world and its agents' sandboxes. Public methods are what the worker client may call."""

    def __init__(self, world: TextCraftWorld, limits: Limits = Limits(), pool: SandboxPool | None = None):
        self.world = world
        self.limits = limits
        self.pool = pool
        self.sandboxes: dict[str, Sandbox] = {}

    @classmethod
    def from_task(cls, task: Task, max_steps: int = DEFAULT_MAX_STEPS, limits: Limits | None = None,
                  sandbox_spares: int = 0):
        """Returns a session whose world is reset to ``task``; ``max_steps`` is the per-agent cell budget.
        ``sandbox_spares`` > 0 draws agents' sandboxes from a per-process pool of that many pre-started ones."""
        limits = limits or Limits()
        pool = _shared_pool(limits, sandbox_spares) if sandbox_spares > 0 else None
        return cls(TextCraftWorld.from_task(task, max_steps=max_steps), limits, pool)

    async def run_cell(self, agent_id: str, code: str, launch: Launch | None = None) -> dict:
        """Runs one cell of ``agent_id``; returns the CellResult fields plus ``finished`` (finish() was called)."""
        if agent_id not in self.world.agents:
            return {"output": "", "error": f"Error: unknown agent {agent_id!r}", "ok": False, "limit": None,
                    "restarted": False, "finished": False}
        sb = self.sandboxes.get(agent_id)
        if sb is None:
            sb = await self.pool.acquire() if self.pool is not None else Sandbox(SYNC_TOOLS, ASYNC_TOOLS, self.limits)
            self.sandboxes[agent_id] = sb

        invalid: list[str] = []  # the cell's launch requests refused as malformed (counted in the turn's record)

        async def launch_tool(args: tuple, kwargs: dict) -> str:
            try:
                req = self.world.subagent_request(agent_id, *args, **kwargs)
            except TypeError as e:
                req = {"error": f"Error: launch_subagent() {str(e).split('() ', 1)[-1]}"}
            if "error" in req:
                if not req["error"].startswith("Not enough budget"):  # the depth refusal is a well-formed request
                    invalid.append(req["error"])
                return req["error"]
            if launch is None:
                return "Error: launch_subagent is not available here"
            return str(await launch(agent_id, req))

        def handler(name: str, args: tuple, kwargs: dict) -> Any:
            if name == "launch_subagent":
                return launch_tool(args, kwargs)
            return self.world.call_tool(agent_id, name, args, kwargs)

        result = await sb.run_cell(code, handler)
        return {**dataclasses.asdict(result), "finished": self.world.finished(agent_id),
                "invalid_launches": len(invalid), "invalid_launch_errors": invalid[:4]}

    async def close(self) -> None:
        """Stops every sandbox of the tree."""
        for sb in self.sandboxes.values():
            await sb.close()
        self.sandboxes.clear()

    def fork(self) -> "TextCraftSession":
        """Returns a branch: an isolated world copy; its agents get fresh sandboxes."""
        return TextCraftSession(self.world.fork(), self.limits, self.pool)

    def commit(self, branch: "TextCraftSession") -> None:
        """Adopts a branch's world state (shared inventory updated in place)."""
        self.world.commit(branch.world)

    def add_agent(self, agent_id: str, targets: dict, parent_id: str | None) -> dict:
        """Registers a sub-agent (inventory snapshot taken now); returns its start inventory."""
        return dict(self.world.add_agent(agent_id, targets, parent_id).start_inventory)

    def observe(self, agent_id: str) -> str:
        """Returns the agent's task string."""
        return self.world.observe(agent_id)

    def check(self, agent_id: str = "root") -> CheckResult:
        """Returns the agent's success label."""
        return self.world.check(agent_id)

    def digest(self) -> str:
        """Returns the world digest."""
        return self.world.digest()

    def view_inventory(self) -> dict:
        """Returns a copy of the shared inventory."""
        return dict(self.world.inventory)


_POOLS: dict[tuple, SandboxPool] = {}


def _shared_pool(limits: Limits, spares: int) -> SandboxPool:
    # One pool per process (env workers run one event loop), per limits configuration.
    key = (limits, spares)
    if key not in _POOLS:
        _POOLS[key] = SandboxPool(SYNC_TOOLS, ASYNC_TOOLS, limits, spares)
    return _POOLS[key]
