"""Infrastructure failures: a tree that failed because its env worker (or a sandbox host) died, or because its
world could not be created, failed through no act of the policy.

The reference gives every errored rollout reward 0 and trains on it (docs/design/algorithm.md §1.2). That is right for errors the
policy causes — a context overflow, its own code crashing its sandbox cell — and those keep the zero reward here.
An infrastructure failure says nothing about the policy: trained as a failure it would push the policy away from
whatever it was doing when a machine died. Such a tree is marked (``tree.misc["infra_failure"]``, the reason; its
failed nodes carry ``node.misc["infra_failure"]``), counted in the step metrics (``infra_failed_trees``), reported
on the console, and left out of credit assignment (``Loop._credit``): its group is credited over the other trees,
and a group with none left is rejected, so a replacement group is admitted.

What counts: the env pool's ``WorkerDied`` / ``TreeFailed``, a broken connection to an env or sandbox host
(``ConnectionError``, ``EOFError``), and any error while creating the world. ``register`` adds the exception types
of other hosts.
"""

from __future__ import annotations

from typing import Any

from envs_py.workers import TreeFailed, WorkerDied

INFRA_KEY = "infra_failure"
_TYPES: list[type[BaseException]] = [WorkerDied, TreeFailed, ConnectionError, EOFError]


def register(exc_type: type[BaseException]) -> None:
    """Counts ``exc_type`` (raised by some env or sandbox host when it fails) as an infrastructure failure; returns
    None."""
    if exc_type not in _TYPES:
        _TYPES.append(exc_type)


def reason(exc: BaseException) -> str | None:
    """Returns ``"Type: message"`` when ``exc`` is an infrastructure failure, else None (the policy's own error)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, tuple(_TYPES)) else None


def mark_node(node: Any, exc: BaseException) -> bool:
    """Marks ``node`` as failed by infrastructure when ``exc`` is such a failure; returns whether it did."""
    why = reason(exc)
    if why is not None:
        node.misc.setdefault(INFRA_KEY, why)
    return why is not None


def mark_tree(tree: Any, why: str | None = None) -> str | None:
    """Marks ``tree`` with ``why`` or else its first infrastructure-failed node's reason; returns the tree's
    reason (None: the tree is the policy's)."""
    if why is None:
        why = next((n.misc[INFRA_KEY] for n in tree.nodes.values() if n.misc.get(INFRA_KEY)), None)
    if why is not None:
        tree.misc.setdefault(INFRA_KEY, why)
    return tree.misc.get(INFRA_KEY)


def failed(tree: Any) -> bool:
    """Returns whether ``tree`` is marked as an infrastructure failure."""
    return bool(tree.misc.get(INFRA_KEY))
