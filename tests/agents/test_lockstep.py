"""Lockstep ticks through the real agent loop: the order of world reads and writes does not depend on timing."""

from __future__ import annotations

import asyncio
import random

import jax

from sera_jax.agents.harness import CURRENT_TURN, Episode, TreeRun, run_episode
from sera_jax.agents.lockstep import Lockstep
from sera_jax.agents.records import Tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings


class JitteryGenerator(ScriptedGenerator):
    """Scripted replies after a random delay, so concurrent members finish generating in random order."""

    def __init__(self, tok, rng):
        super().__init__(tok, {}, default="ok")
        self.rng = rng

    async def generate(self, prompt_ids, params, key=None):
        await asyncio.sleep(self.rng.random() * 0.02)
        return await super().generate(prompt_ids, params, key)


class LoggingEpisode(Episode):
    def __init__(self, run, node, log, turns, fail_at=None):
        super().__init__(run, node)
        self.log, self.turns, self.fail_at = log, turns, fail_at

    async def start(self):
        self.messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        self.log.append(("start", self.node.id))

    async def before_turn(self):
        await asyncio.sleep(random.random() * 0.01)
        self.log.append(("observe", self.node.id, len(self.node.turns)))
        return False

    async def act(self, turn, text):
        if self.fail_at == turn.index:
            raise RuntimeError("boom")
        self.log.append(("act", self.node.id, turn.index))
        self.done = turn.index + 1 >= self.turns

    async def finish(self):
        self.log.append(("exit", self.node.id))


def _run_group(tok, seed):
    rng = random.Random(seed)
    random.seed(seed)
    s = RuntimeSettings.for_env("textworld_sync", max_steps=4, deterministic=True)
    run = TreeRun(Tree("t", "task", "root"), JitteryGenerator(tok, rng), tok, s, jax.random.key(0), None)
    members = {"a": dict(turns=3), "b": dict(turns=1), "c": dict(turns=9), "d": dict(turns=5, fail_at=1)}
    gate = Lockstep(list(members))
    log: list = []

    async def main():
        eps = []
        for mid, kw in members.items():
            node = run.new_node(mid, "g", depth=1, parent_id="root", fork_step=0, max_steps=4)
            ep = LoggingEpisode(run, node, log, **kw)
            ep.gate = gate
            eps.append(ep)
        await asyncio.gather(*(run_episode(ep) for ep in eps))

    asyncio.run(main())
    assert CURRENT_TURN.get() is None
    return log, run.tree


def test_lockstep_order_is_independent_of_timing(tok):
    logs = [_run_group(tok, seed)[0] for seed in range(4)]
    writes = [[e for e in log if e[0] in ("act", "exit")] for log in logs]
    assert all(w == writes[0] for w in writes[1:])
    assert writes[0] == [
        ("act", "a", 0), ("act", "b", 0), ("act", "c", 0), ("act", "d", 0),          # tick 0
        ("act", "a", 1), ("exit", "b"), ("act", "c", 1), ("exit", "d"),              # tick 1: b done, d failed
        ("act", "a", 2), ("act", "c", 2),                                            # tick 2
        ("exit", "a"), ("act", "c", 3),                                              # tick 3
        ("exit", "c"),                                                               # c's budget (4) is spent
    ]
    # No act of a tick comes before every member still in the group has observed it.
    for log in logs:
        for k in range(4):
            acts = [i for i, e in enumerate(log) if e[0] == "act" and e[2] == k]
            reads = [i for i, e in enumerate(log) if e[0] == "observe" and e[2] == k]
            assert not acts or max(reads) < min(acts)
    tree = _run_group(tok, 0)[1]
    assert tree.nodes["d"].rollout_error_zero_reward and "boom" in tree.nodes["d"].error_message
    assert tree.nodes["c"].error_message is None and len(tree.nodes["c"].turns) == 4
