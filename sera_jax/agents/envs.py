"""The runtime's handles on one tree's world, for both environments (no JAX here: env workers import this module).

TextCraft worlds always live in env worker processes (``envs_py.workers.WorkerPool``) together with their agents'
sandboxes; ``TextCraftTreeEnv`` is the async handle the agent loop uses. TextWorld-Sync worlds live either in an env
worker (``PoolTextWorldEnv``; the default for training, so world steps never run on the event loop) or in-process
behind a ``Coordinator`` (``LocalTextWorldEnv``; microsecond steps, handy for tests and single-process tools).
Every handle offers ``fork()`` → an isolated branch handle, ``commit(branch)``, ``state()`` (the observable shared
state) and ``close()``, which the launchers of the rubric stage use for counterfactual branches and rubric inputs.

``RUNTIME_FACTORIES`` is the worker registry the runtime starts its pools with (each registered environment's
``worker_factory``, see ``agents.environments``): TextCraft through
``RuntimeTextCraftSession`` (the env team's session plus a read-only ``agent_status``, since the runtime must record
each agent's finish message, and with the depth limit left to the runtime), TextWorld-Sync through ``make_world``.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from envs_py.core import CheckResult, StepResult
from envs_py.textcraft.session import TextCraftSession
from envs_py.textcraft.solver import gold_plan
from envs_py.textworld_sync.coordinator import Coordinator
from sera_jax.agents import environments
from sera_jax.agents.environments.textcraft import NAME as TEXTCRAFT_NAME
from sera_jax.agents.environments.textworld import NAME as TEXTWORLD_NAME



def runtime_factories() -> dict[str, str]:
    """Returns the WorkerPool factories of the registered environments whose worlds run in env workers."""
    return {n: f for n in environments.names() if (f := environments.environment(n).worker_factory)}


RUNTIME_FACTORIES = runtime_factories()  # the built-ins' (tests extend it with their own worlds)
_branch_ids = itertools.count()


class RuntimeTextCraftSession(TextCraftSession):
    """A TextCraft session that also reports an agent's finish message and depth (read-only)."""

    @classmethod
    def from_task(cls, task, **kwargs) -> "RuntimeTextCraftSession":
        """Returns a session for ``task`` whose world leaves the depth limit to the runtime: the runtime refuses
        deep launches itself (same text), so the limit is a runtime setting and refusals are recorded."""
        session = super().from_task(task, **kwargs)
        session.world.max_subagent_depth = 1 << 30
        return session

    def agent_status(self, agent_id: str) -> dict:
        """Returns ``{"known", "finish_message", "depth", "start_inventory"}`` of one agent."""
        rec = self.world.agents.get(agent_id)
        if rec is None:
            return {"known": False, "finish_message": None, "depth": None, "start_inventory": {}}
        return {"known": True, "finish_message": rec.finish_message, "depth": rec.depth,
                "start_inventory": dict(rec.start_inventory)}

    def local_plan(self, agent_id: str) -> list | None:
        """Returns a gold plan for the agent's targets from its start inventory (None when none exists)."""
        rec = self.world.agents.get(agent_id)
        return None if rec is None else gold_plan(self.world.book, rec.start_inventory, rec.targets)

    def fork(self) -> "RuntimeTextCraftSession":
        """Returns a branch of the same class (isolated world copy, fresh sandboxes)."""
        return RuntimeTextCraftSession(self.world.fork(), self.limits, self.pool)


def _pool_tree_id(tree_id: str) -> str:
    # Unique per run so two runs of the same tree id never collide in a worker (the worker refuses overwrites).
    return f"{tree_id}@{uuid.uuid4().hex[:12]}"


class TextCraftTreeEnv:
    """Async handle on one TextCraft tree hosted by a WorkerPool."""

    def __init__(self, pool: Any, pool_tree_id: str):
        self.pool, self.pool_tree_id = pool, pool_tree_id

    @classmethod
    async def create(cls, pool: Any, tree_id: str, task: Any, *, max_steps: int, sandbox_spares: int = 0,
                     limits: Any = None):
        """Returns a handle on a fresh tree for ``task`` (root agent ``"root"``) in ``pool``."""
        env = cls(pool, _pool_tree_id(tree_id))
        await pool.create(env.pool_tree_id, TEXTCRAFT_NAME, task, max_steps=max_steps, sandbox_spares=sandbox_spares,
                          limits=limits)
        return env

    async def observe(self, agent_id: str) -> str:
        """Returns the agent's task string (``Your Goal: …`` + budget line)."""
        return await self.pool.call(self.pool_tree_id, "observe", agent_id)

    async def add_agent(self, agent_id: str, targets: dict, parent_id: str) -> dict:
        """Registers a sub-agent (inventory snapshot now); returns its start inventory."""
        return await self.pool.call(self.pool_tree_id, "add_agent", agent_id, targets, parent_id)

    async def run_cell(self, agent_id: str, code: str, launch) -> dict:
        """Runs one cell in the agent's sandbox; returns output/error/ok/limit/restarted/finished."""
        return await self.pool.run_cell(self.pool_tree_id, agent_id, code, launch)

    async def local_plan(self, agent_id: str) -> list | None:
        """Returns the agent's gold plan from its start inventory, or None (never shown to the model)."""
        return await self.pool.call(self.pool_tree_id, "local_plan", agent_id)

    async def status(self, agent_id: str) -> dict:
        """Returns the agent's finish message, depth and start inventory."""
        return await self.pool.call(self.pool_tree_id, "agent_status", agent_id)

    async def check(self, agent_id: str) -> CheckResult:
        """Returns the agent's programmatic success label."""
        return await self.pool.call(self.pool_tree_id, "check", agent_id)

    async def view_inventory(self) -> dict:
        """Returns a copy of the shared inventory."""
        return await self.pool.call(self.pool_tree_id, "view_inventory")

    async def digest(self) -> str:
        """Returns the world digest."""
        return await self.pool.call(self.pool_tree_id, "digest")

    async def state(self) -> dict:
        """Returns the observable shared state (for rubric writers and judges): ``{"inventory": {...}}``."""
        return {"inventory": await self.view_inventory()}

    async def fork(self) -> "TextCraftTreeEnv":
        """Returns a handle on an isolated branch of this tree (same worker)."""
        branch = TextCraftTreeEnv(self.pool, f"{self.pool_tree_id}/b{next(_branch_ids)}")
        await self.pool.fork(self.pool_tree_id, branch.pool_tree_id)
        return branch

    async def commit(self, branch: "TextCraftTreeEnv") -> None:
        """Adopts a branch's world state."""
        await self.pool.commit(self.pool_tree_id, branch.pool_tree_id)

    async def close(self) -> None:
        """Frees the tree and its sandboxes in the worker."""
        await self.pool.drop(self.pool_tree_id)


class PoolTextWorldEnv:
    """Async handle on one TextWorld-Sync world hosted by a WorkerPool (each call is one atomic commit there)."""

    def __init__(self, pool: Any, pool_tree_id: str):
        self.pool, self.pool_tree_id = pool, pool_tree_id

    @classmethod
    async def create(cls, pool: Any, tree_id: str, task: Any, *, rules: str = "reference"):
        """Returns a handle on a fresh world for ``task`` in ``pool``."""
        env = cls(pool, _pool_tree_id(tree_id))
        await pool.create(env.pool_tree_id, TEXTWORLD_NAME, task, rules=rules)
        return env

    async def add_agent(self, agent_id: str) -> None:
        await self.pool.call(self.pool_tree_id, "add_agent", agent_id)

    async def observe(self, agent_id: str) -> tuple[str, dict]:
        """Returns the agent's (observation, infos)."""
        return await self.pool.call(self.pool_tree_id, "observe_full", agent_id)

    async def step(self, agent_id: str, action: str) -> StepResult:
        """Commits one action; returns its StepResult."""
        return await self.pool.call(self.pool_tree_id, "step", agent_id, action)

    async def inventory_text(self) -> str:
        return await self.pool.call(self.pool_tree_id, "inventory_text")

    async def check(self) -> CheckResult:
        return await self.pool.call(self.pool_tree_id, "check")

    async def digest(self) -> str:
        return await self.pool.call(self.pool_tree_id, "digest")

    async def state(self) -> dict:
        """Returns the world's object tree (docs/design/textworld.md §8), the observable state for rubric writers and
        judges."""
        return await self.pool.call(self.pool_tree_id, "get_object_tree")

    async def fork(self) -> "PoolTextWorldEnv":
        branch = PoolTextWorldEnv(self.pool, f"{self.pool_tree_id}/b{next(_branch_ids)}")
        await self.pool.fork(self.pool_tree_id, branch.pool_tree_id)
        return branch

    async def commit(self, branch: "PoolTextWorldEnv") -> None:
        await self.pool.commit(self.pool_tree_id, branch.pool_tree_id)

    async def close(self) -> None:
        await self.pool.drop(self.pool_tree_id)


class LocalTextWorldEnv:
    """In-process TextWorld-Sync world behind a Coordinator (its async lock serialises concurrent agents)."""

    def __init__(self, coordinator: Any):
        self.coordinator = coordinator

    @classmethod
    async def create(cls, task: Any, *, rules: str = "reference") -> "LocalTextWorldEnv":
        return cls(Coordinator(task, rules))

    async def add_agent(self, agent_id: str) -> None:
        self.coordinator.fork_shared(agent_id)

    async def observe(self, agent_id: str) -> tuple[str, dict]:
        return await self.coordinator.observe(agent_id)

    async def step(self, agent_id: str, action: str) -> StepResult:
        return await self.coordinator.step(agent_id, action)

    async def inventory_text(self) -> str:
        async with self.coordinator.transaction() as world:
            return world.inventory_text()

    async def check(self) -> CheckResult:
        return self.coordinator.check()

    async def digest(self) -> str:
        return self.coordinator.digest()

    async def state(self) -> dict:
        """Returns the world's object tree (docs/design/textworld.md §8)."""
        return self.coordinator.get_object_tree()

    async def fork(self) -> "LocalTextWorldEnv":
        return LocalTextWorldEnv(self.coordinator.fork())

    async def commit(self, branch: "LocalTextWorldEnv") -> None:
        self.coordinator.commit(branch.coordinator)

    async def close(self) -> None:
        return None
