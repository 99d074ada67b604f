"""What happens at a delegation: the launcher strategy invoked for every ``launch_subagent`` call / delegate block.

The environment code (``codeact.py``, ``textworld.py``) validates the request, refuses it at the depth limit, names
the children and then hands a ``LaunchRequest`` to ``TreeRun.launcher.launch``. The request carries everything a
strategy needs: the parent node, its step (``fork_step``), its conversation so far and the whole raw reply that
delegated (``parent_action``: what every rubric writer is shown, in every stage), the children's specs, the tree's
env handle (``fork`` / ``commit`` for branches) and ``start_child(spec, env=None, gate=None)``, which creates one
child on the given env (default: the shared world) and runs its whole episode (inside a ``Lockstep`` group when a
gate is given).

``DefaultLauncher`` (docs/design/algorithm.md §1.4 "default") runs the children concurrently on the shared world — in deterministic
mode a group launched together runs in lockstep ticks — and returns them. Strategies of the next stages plug in
here without touching the loops: a rubric coordinator wraps ``DefaultLauncher`` (write a rubric before, score after); a
counterfactual collector forks ``req.env`` B times, runs ``start_child(spec, env=branch)`` on each, commits branch 0
and returns its children with ``texts`` overriding what the parent is told; test-time selection does the same with
N candidates. The parent sees ``LaunchOutcome.texts`` when given, else the environment's default result text.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Awaitable, Callable, Protocol

from sera_jax.agents.lockstep import Lockstep
from sera_jax.agents.records import Node


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """One requested child: id (= node path), goal text, depth, own turn budget, and env-specific extras
    (TextCraft: ``targets``; the parent's ``context`` string; TextWorld: ``requested_steps``, the delegate's own
    ``max_steps`` before the cap, which the rubric writer is shown as the child's budget)."""

    child_id: str
    goal: str
    depth: int
    max_steps: int
    targets: dict[str, int] | None = None
    context: str = ""
    requested_steps: int | None = None

    def budget_shown(self) -> int:
        """Returns the child budget the rubric writer sees: the delegate's requested ``max_steps`` when the
        delegation named one (TextWorld), else the child's turn budget (TextCraft: 20)."""
        return self.max_steps if self.requested_steps is None else self.requested_steps


@dataclasses.dataclass
class LaunchRequest:
    """A delegation about to happen (see the module docstring)."""

    run: Any                      # the TreeRun
    parent: Node
    fork_step: int
    specs: list[ChildSpec]
    parent_messages: list[dict]   # the parent's conversation before this turn's action (system, task, history)
    parent_action: str            # the whole raw reply that delegated (TextCraft: thought + code, ``</python>``
                                  # appended when missing; TextWorld: the reply text, delegate block included)
    env: Any                      # the tree's env handle (TextCraftTreeEnv / TextWorld env)
    start_child: Callable[..., Awaitable[Node]]   # start_child(spec, env=None, gate=None) -> the finished child
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LaunchOutcome:
    """What a launcher returns: the children the parent is answered about (in spec order), the kind recorded on
    the DelegationPoint, optional result texts overriding the env's default, and extras for the record."""

    children: list[Node]
    kind: str = "default"
    texts: list[str] | None = None
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)


class Launcher(Protocol):
    async def launch(self, req: LaunchRequest) -> LaunchOutcome: ...


class DefaultLauncher:
    """Runs every requested child on the shared world and returns them (docs/design/algorithm.md §1.4 default launcher)."""

    kind = "default"

    async def launch(self, req: LaunchRequest) -> LaunchOutcome:
        """Returns the finished children, run concurrently on the shared world (``asyncio.gather``); in
        deterministic mode a group of several runs in lockstep ticks (acts in spec order, see ``lockstep.py``)."""
        if req.run.settings.deterministic and len(req.specs) > 1:
            gate = Lockstep([spec.child_id for spec in req.specs])
            children = await asyncio.gather(*(req.start_child(spec, gate=gate) for spec in req.specs))
        else:
            children = await asyncio.gather(*(req.start_child(spec) for spec in req.specs))
        return LaunchOutcome(children=list(children), kind=self.kind)


def child_result(child: Node) -> str:
    """Returns the child's result for its parent: finish message if present (not None), else error message, else ''."""
    if child.finish_message is not None:
        return child.finish_message
    return child.error_message or ""
