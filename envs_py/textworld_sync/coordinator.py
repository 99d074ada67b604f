"""One coordinator per task: the lock that turns every action into one atomic commit (docs/design/textworld.md §6.1).

All agents of a tree share one `Coordinator`. `step` and `observe` take the coordinator's lock, so an action is
validated, applied, counted and observed as one indivisible transaction, and concurrent agents are serialised in
lock-acquisition order. The async API (for asyncio agents) and the sync API (threads, worker processes) use the same
underlying lock. `AgentView` is the thin per-agent handle; delegation makes a new view on the *same* coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from envs_py.core import CheckResult, StepResult
from envs_py.textworld_sync.world import ROOT, World


class Coordinator:
    """Owns a World and its lock; offers reset / fork_shared / observe / step / snapshot / fork / commit."""

    def __init__(self, task: Any, rules: str = "reference", *, world: World | None = None):
        self.world = world if world is not None else World(task, rules)
        self._tlock = threading.Lock()
        self._alock: asyncio.Lock | None = None
        if world is None:
            self.world.reset()

    def _async_lock(self) -> asyncio.Lock:
        if self._alock is None:
            self._alock = asyncio.Lock()
        return self._alock

    # ------------------------------------------------------------------ sync API

    def reset(self, seed: Any = None) -> tuple[str, dict]:
        """Resets the world (the seed is accepted and ignored, docs/design/textworld.md §2.5); returns the root's (observation, infos)."""
        with self._tlock:
            self.world.reset()
            return self.world.observe_full(ROOT)

    def fork_shared(self, agent_id: str) -> "AgentView":
        """Returns a view for `agent_id` on this same world; a new agent starts at the root's location."""
        with self._tlock:
            self.world.add_agent(agent_id)
        return AgentView(self, agent_id)

    def observe_sync(self, agent_id: str) -> tuple[str, dict]:
        """Returns (observation, infos) for the agent, under the lock."""
        with self._tlock:
            return self.world.observe_full(agent_id)

    def step_sync(self, agent_id: str, action: Any) -> StepResult:
        """Commits one action of the agent atomically (thread-safe); returns its StepResult."""
        with self._tlock:
            return self.world.step(agent_id, action)

    def check(self, agent_id: str = ROOT) -> CheckResult:
        """Returns the task's success label and the scorer's report."""
        with self._tlock:
            return self.world.check(agent_id)

    def digest(self) -> str:
        """Returns the world's state digest."""
        with self._tlock:
            return self.world.digest()

    def get_object_tree(self) -> dict:
        """Returns the world's object tree (docs/design/textworld.md §8)."""
        with self._tlock:
            return self.world.get_object_tree()

    def get_events(self) -> list[dict]:
        """Returns the committed events in commit order."""
        with self._tlock:
            return self.world.get_events()

    @property
    def steps(self) -> int:
        return self.world.steps

    # ------------------------------------------------------------------ async API

    async def observe(self, agent_id: str) -> tuple[str, dict]:
        """Returns (observation, infos) for the agent, serialised with every other agent's actions."""
        async with self._async_lock():
            with self._tlock:
                return self.world.observe_full(agent_id)

    async def step(self, agent_id: str, action: Any) -> StepResult:
        """Validates, applies, counts and observes one action as one atomic commit; returns its StepResult."""
        async with self._async_lock():
            with self._tlock:
                return self.world.step(agent_id, action)

    @contextlib.asynccontextmanager
    async def transaction(self):
        """Yields the World under the lock, for a caller that must read and act as one commit (e.g. an oracle)."""
        async with self._async_lock():
            with self._tlock:
                yield self.world

    # ------------------------------------------------------------------ branches

    def snapshot(self) -> World:
        """Returns an isolated copy of the current world state (taken under the lock)."""
        with self._tlock:
            return self.world.fork()

    def fork(self) -> "Coordinator":
        """Returns a new coordinator on an isolated clone of this world (a counterfactual branch)."""
        return Coordinator(None, world=self.snapshot())

    def commit(self, branch: "Coordinator | World") -> None:
        """Adopts a branch's state (a forked Coordinator or World of the same task) as this world's state."""
        other = branch.snapshot() if isinstance(branch, Coordinator) else branch
        with self._tlock:
            self.world.commit(other)


class AgentView:
    """The handle one agent acts through: (coordinator, agent_id)."""

    __slots__ = ("coordinator", "agent_id")

    def __init__(self, coordinator: Coordinator, agent_id: str):
        self.coordinator = coordinator
        self.agent_id = agent_id

    async def observe_async(self) -> tuple[str, dict]:
        """Returns this agent's (observation, infos)."""
        return await self.coordinator.observe(self.agent_id)

    async def step(self, action: Any) -> StepResult:
        """Commits one action of this agent; returns its StepResult."""
        return await self.coordinator.step(self.agent_id, action)

    def fork_shared(self, child_id: str) -> "AgentView":
        """Returns a view for a sub-agent on the same coordinator (it starts at the root's location)."""
        return self.coordinator.fork_shared(child_id)
