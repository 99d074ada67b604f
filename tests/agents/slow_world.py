"""A TextWorld-Sync world whose every step takes ``delay_s`` seconds (a deliberately slow env for overlap tests).
Imported by env worker processes through the workers registry."""

from __future__ import annotations

import time

from envs_py.textworld_sync.world import World


class SlowWorld(World):
    __slots__ = ("delay_s",)

    def step(self, agent_id, action):
        time.sleep(self.delay_s)  # blocks this worker process only: the runtime's event loop must not notice
        return super().step(agent_id, action)

    def fork(self):
        other = super().fork()
        slow = object.__new__(SlowWorld)
        for name in World.__slots__:
            setattr(slow, name, getattr(other, name))
        slow.delay_s = self.delay_s
        return slow


def make_slow_world(task, rules: str = "reference", delay_s: float = 1.0) -> SlowWorld:
    """Returns a reset SlowWorld."""
    w = SlowWorld(task, rules)
    w.delay_s = delay_s
    w.reset()
    return w
