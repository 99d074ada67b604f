"""The environment protocol shared by TextCraft-Synth and TextWorld-Sync.

Both worlds are pure Python (no JAX) and are driven by the host-side agent runtime. A world holds the state that
every agent of one tree shares; agents are identified by string ids. The runtime needs exactly these operations:

* ``reset(task)``        -> str    initial observation for the root agent
* ``observe(agent_id)``  -> str    what that agent currently sees
* ``step(agent_id, action)`` -> StepResult   validate, apply and count one action atomically
* ``fork()``             -> Env    a fully isolated copy (counterfactual branches, test-time selection)
* ``commit(branch)``     -> None   adopt a fork's state as this world's state
* ``check(agent_id)``    -> CheckResult   the programmatic success label of one agent's (sub-)task
* ``digest()``           -> str    a stable hash of the whole world state (equal digests = equal states)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Task:
    """One task row: its id, difficulty tier name and the environment-specific payload."""

    task_id: str
    difficulty: str
    goal: str
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """Observation text after an action, whether the agent is done, and structured extras (``infos``)."""

    observation: str
    done: bool = False
    error: str = ""
    infos: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Success label of one agent's task and a human-readable reason (missing items, unmet steps)."""

    success: bool
    reason: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    def reset(self, task: Task) -> str: ...

    def observe(self, agent_id: str) -> str: ...

    def step(self, agent_id: str, action: Any) -> StepResult: ...

    def fork(self) -> "Env": ...

    def commit(self, branch: "Env") -> None: ...

    def check(self, agent_id: str) -> CheckResult: ...

    def digest(self) -> str: ...
