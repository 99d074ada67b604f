"""The TextCraft success label (docs/design/textcraft.md §8, docs/design/algorithm.md §1.7), for the root agent and any sub-agent."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from envs_py.core import CheckResult


@dataclasses.dataclass
class AgentRecord:
    """What the checker needs of one agent: its targets, the shared inventory at its start, its finish message."""

    agent_id: str
    targets: dict[str, int]
    start_inventory: dict[str, int]
    parent_id: str | None = None
    depth: int = 0
    finish_message: str | None = None

    def copy(self) -> "AgentRecord":
        """Returns an independent copy (for world forks)."""
        return dataclasses.replace(self, targets=dict(self.targets), start_inventory=dict(self.start_inventory))

    def state(self) -> tuple:
        """Returns a canonical, hashable summary (for digests)."""
        return (self.agent_id, sorted(self.targets.items()), sorted(self.start_inventory.items()), self.parent_id,
                self.depth, self.finish_message)


def check_agent(record: AgentRecord, inventory: Mapping[str, int]) -> CheckResult:
    """Returns success iff the agent has at least one target, finished with a non-empty message, and every target's
    net increase (current count minus the count at the agent's start) reaches its required amount. An agent with no
    targets has been asked for nothing, so finishing cannot earn it a success label."""
    missing = {}
    for item, need in record.targets.items():
        gained = inventory.get(item, 0) - record.start_inventory.get(item, 0)
        if gained < need:
            missing[item] = need - max(gained, 0)
    details = {"target_items": dict(record.targets), "initial_inventory": dict(record.start_inventory),
               "final_inventory": dict(inventory)}
    if missing:
        details["missing_items"] = missing
    if not any(need > 0 for need in record.targets.values()):
        return CheckResult(False, "the agent has no targets, so nothing it does counts as success", details)
    if not record.finish_message:
        reason = "ended without calling finish()" if record.finish_message is None else \
            "finish() was called with an empty message, which counts as not finishing"
        return CheckResult(False, reason, details)
    if missing:
        return CheckResult(False, "targets not met: " + ", ".join(f"{k} short by {v}" for k, v in missing.items()),
                           details)
    return CheckResult(True, "all targets crafted", details)
