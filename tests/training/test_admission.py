"""Rollout admission (docs/design/recipes.md §2): one group per rank, every admitted group trained, no speed bias, staleness
bounded by max_head_offpolicyness with pipelining across the update; and the per-rank task stream."""

from __future__ import annotations

import asyncio
import collections

import pytest

from sera_jax.assembly.concurrency import per_rank_concurrency
from sera_jax.rl.baselines import GroupCredit
from sera_jax.training.admission import Admission
from sera_jax.training.task_stream import TaskStream


class World:
    """Scripted task groups: task i delegates (slow, 40 ms) when i is even, else answers at once (1 ms); groups
    of tasks in ``reject`` fail the stage filter. Records running groups per rank and the version of every start."""

    def __init__(self, reject=frozenset(), slow=0.04, fast=0.001):
        self.reject, self.slow, self.fast = set(reject), slow, fast
        self.running = 0
        self.max_running = 0
        self.started: list[tuple[int, int]] = []     # (task, version)
        self.finished: list[int] = []

    async def run_group(self, task, stage, version):
        self.started.append((task, version))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.slow if task % 2 == 0 else self.fast)
        finally:
            self.running -= 1
        self.finished.append(task)
        return [task]

    def credit(self, stage, trees):
        return GroupCredit(datums=list(trees), accepted=trees[0] not in self.reject)


def _admission(world, n=64, ranks=4, **kw):
    stream = TaskStream(n, seed=0, ranks=ranks)
    return Admission(world.run_group, world.credit, list(range(n)), stream, **kw), stream


async def _steps(adm, ranks, steps, *, update_s=0.0):
    """Runs ``steps`` collections (a sleep stands for each update); returns [(version, [AdmittedGroup])]."""
    out = []
    for v in range(steps):
        groups, stats = await adm.collect("execution", v, ranks, max_attempts=100)
        out.append((v, groups, stats))
        await asyncio.sleep(update_s)
    await adm.close()
    return out


def test_per_rank_concurrency_follows_the_reference_split():
    assert [per_rank_concurrency(x) for x in (8, 12, 24, 32, 4)] == [1, 1, 3, 4, 1]


def test_task_stream_shards_per_rank_and_repeats_the_order_without_reshuffle():
    s = TaskStream(10, seed=3, ranks=3)
    perm = s.permutation(0)
    assert s.shard(1, 0) == perm[1::3][:3] and len(s.shard(2, 0)) == 3     # ragged tail dropped
    first = [s.next(1) for _ in range(3)]
    assert first == perm[1::3][:3] and s.epochs[1] == 0
    s.next(1)
    assert s.epochs[1] == 1 and s.epochs[0] == 0                           # ranks pass at their own pace
    fixed = TaskStream(10, seed=3, reshuffle=False)
    assert fixed.shard(0, 0) == fixed.shard(0, 5)                          # the reference: same order each pass
    assert TaskStream(10, seed=3).shard(0, 0) != TaskStream(10, seed=3).shard(0, 1)
    s.requeue(1, [7, 8])
    assert [s.next(1), s.next(1)] == [7, 8]
    t = TaskStream.from_json(s.to_json())
    assert [t.next(r) for r in (0, 1, 2, 1)] == [s.next(r) for r in (0, 1, 2, 1)]
    legacy = TaskStream.from_json({"num_tasks": 10, "seed": 3, "epoch": 0, "cursor": 2, "order": perm})
    assert legacy.next() == perm[2]                                        # a pre-rank checkpoint continues
    with pytest.raises(ValueError, match="empty"):
        TaskStream(0, seed=0)


def test_trained_groups_are_the_admitted_groups_without_speed_bias():
    # ofp = 0: one group per rank at a time, every accepted group trained, in the rank's data order — slow
    # (delegating) groups are trained as often as they are drawn, although fast ones finish first.
    world = World(reject={5, 11, 30, 50, 61})
    adm, stream = _admission(world, ranks=4)
    out = asyncio.run(_steps(adm, 4, steps=5))
    trained = [g.task_index for _, groups, _ in out for g in groups]
    admitted = [t for t, _ in world.started]
    assert sorted(trained) == sorted(t for t in admitted if t not in world.reject)     # nothing left untrained
    ref = TaskStream(64, seed=0, ranks=4)
    for r in range(4):
        shard = [t for t in ref.shard(r, 0) if t not in world.reject]
        assert [g.task_index for _, groups, _ in out for g in groups if g.rank == r] == shard[:5]
    slow_drawn = sum(t % 2 == 0 for t in admitted if t not in world.reject)
    assert sum(t % 2 == 0 for t in trained) == slow_drawn > 0
    assert world.max_running <= 4                                      # one group in flight per rank
    for v, groups, stats in out:
        assert [g.rank for g in groups] == [0, 1, 2, 3] and all(g.start_version == v for g in groups)
        assert stats["groups_carried"] == 0
    assert sum(s["groups_rejected"] for _, _, s in out) == sum(t in world.reject for t in admitted) >= 1


def test_first_to_finish_would_have_been_biased():
    # The control for the test above: with the same world, the groups that finish first are mostly fast ones.
    world = World()
    order = []

    async def race():
        tasks = [asyncio.ensure_future(world.run_group(t, "execution", 0)) for t in range(16)]
        for fut in asyncio.as_completed(tasks):
            order.append((await fut)[0])
    asyncio.run(race())
    assert sum(t % 2 == 0 for t in order[:8]) == 0


def test_pipelined_groups_run_across_the_update_and_lag_at_most_ofp():
    # TextCraft RAO: ofp = 3, C = 1. A rank's next group starts when it delivers and generates during the update,
    # so from the second step on every trained group was started by an earlier version; never by more than ofp.
    # Groups of equal length: no rank runs ahead of the other, so each is trained exactly one version later.
    world = World(slow=0.02, fast=0.02)
    adm, _ = _admission(world, ranks=2, concurrency=1, max_offpolicyness=3)
    out = asyncio.run(_steps(adm, 2, steps=4, update_s=0.01))
    assert world.max_running <= 2
    for v, groups, stats in out:
        assert len(groups) == 2 and all(v - g.start_version == min(v, 1) for g in groups), (v, groups)
        assert stats["groups_carried"] == 2 and stats["group_lag_max"] == min(v, 1)
    starts = dict(world.started)
    assert all(starts[g.task_index] == g.start_version for _, groups, _ in out for g in groups)


def test_a_rank_whose_groups_finish_fast_runs_ahead_but_never_past_ofp():
    # Mixed lengths (the reference's quota allows it): while one rank waits on a slow group, the other may bank up
    # to ofp accepted groups, which are then trained more than one version late, but never more than ofp.
    world = World()
    adm, _ = _admission(world, ranks=2, concurrency=1, max_offpolicyness=3)
    out = asyncio.run(_steps(adm, 2, steps=8, update_s=0.005))
    assert world.max_running <= 2
    lags = [v - g.start_version for v, groups, _ in out for g in groups]
    assert len(lags) == 16 and all(0 <= lag <= 3 for lag in lags)
    assert all(lag >= 1 for v, groups, _ in out[1:] for g in groups for lag in [v - g.start_version])


@pytest.mark.parametrize("ofp", [0, 1])
def test_speculative_groups_change_when_not_which(ofp):
    # The tiny default's speculative group per rank: the same groups are trained, rank by rank, as without it.
    plain, spec = World(reject={3, 9, 12}), World(reject={3, 9, 12})
    a, _ = _admission(plain, ranks=2, max_offpolicyness=ofp)
    b, _ = _admission(spec, ranks=2, max_offpolicyness=ofp, speculative=2)
    want = asyncio.run(_steps(a, 2, steps=6))
    got = asyncio.run(_steps(b, 2, steps=6))
    per_rank = lambda out: collections.Counter((g.rank, g.task_index) for _, gs, _ in out for g in gs)
    assert per_rank(got) == per_rank(want)
    assert all(v - g.start_version <= ofp for v, gs, _ in got for g in gs)
    assert spec.max_running > plain.max_running                      # they did run ahead
    assert sum(s["groups_speculative"] for _, _, s in got) > 0


def test_close_hands_running_tasks_back_and_attempts_are_bounded():
    world = World(reject=set(range(64)))                             # a policy that never passes the filter
    adm, stream = _admission(world, ranks=2)
    groups, stats = asyncio.run(adm.collect("execution", 0, 2, max_attempts=5))
    assert groups == [] and stats["groups_started"] == 5 and stats["groups_rejected"] == 5

    world = World()
    adm, stream = _admission(world, ranks=2, max_offpolicyness=1)

    async def one_step_then_close():
        await adm.collect("execution", 0, 2, max_attempts=10)
        pending = adm.pending()
        await adm.close()
        return pending
    pending = asyncio.run(one_step_then_close())
    assert sorted(pending) == [0, 1] and all(len(v) == 1 for v in pending.values())
    assert [stream.next(r) for r in (0, 1)] == [pending[0][0], pending[1][0]]   # drawn again first


def test_a_running_group_of_another_stage_is_refused():
    world = World()
    adm, _ = _admission(world, ranks=1, max_offpolicyness=2)

    async def go():
        await adm.collect("execution", 0, 1, max_attempts=5)
        try:
            await adm.collect("delegation", 1, 1, max_attempts=5)
        finally:
            await adm.close()
    with pytest.raises(RuntimeError, match="max_head_offpolicyness = 0"):
        asyncio.run(go())
