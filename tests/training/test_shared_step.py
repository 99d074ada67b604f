"""A multi-host step's shared figures, without processes: the step split into two processes' shares must give every
process the decisions, weights and batch rows one process computing the whole step would.

(The processes themselves run in ``tests/parallel/test_multihost_loop.py``.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sera_jax.parallel.hosts import DistributedError, deal_ranks, distributed_settings
from sera_jax.rl.baselines import GroupCredit, apply_depth_weights, step_rubric_credit, step_rubric_rewards
from sera_jax.rl.stages import method_config
from sera_jax.training.step_batch import build_batch, build_shared_batch
from sera_jax.training.task_stream import merge_streams
from sera_jax.training.shared_step import SharedStep, local_figures
from sera_jax.training.task_stream import TaskStream
from tests.rl.rl_builders import random_datums


@pytest.mark.parametrize("ranks,processes", [(8, 2), (2, 2), (1, 2), (7, 3), (8, 8), (3, 1)])
def test_ranks_are_dealt_in_contiguous_blocks_covering_every_rank_once(ranks, processes):
    shares = [deal_ranks(ranks, p, processes) for p in range(processes)]
    assert [r for s in shares for r in s] == list(range(ranks))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("env,message", [
    ({"SERA_COORDINATOR": "h:1"}, "missing SERA_NUM_PROCESSES, SERA_PROCESS_ID"),
    ({"SERA_COORDINATOR": "h:1", "SERA_NUM_PROCESSES": "2", "SERA_PROCESS_ID": "2"}, "not a process id"),
    ({"SERA_COORDINATOR": "h", "SERA_NUM_PROCESSES": "2", "SERA_PROCESS_ID": "0"}, "host:port"),
    ({"SERA_COORDINATOR": "h:1", "SERA_NUM_PROCESSES": "two", "SERA_PROCESS_ID": "0"}, "must be an integer"),
])
def test_bad_job_settings_are_named(monkeypatch, env, message):
    for k in ("SERA_COORDINATOR", "SERA_NUM_PROCESSES", "SERA_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
              "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistributedError, match=message):
        distributed_settings()


def test_no_settings_or_one_process_is_a_plain_run(monkeypatch):
    for k in ("SERA_COORDINATOR", "SERA_NUM_PROCESSES", "SERA_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
              "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    assert distributed_settings() is None
    monkeypatch.setenv("SERA_NUM_PROCESSES", "1")
    assert distributed_settings() is None
    monkeypatch.setenv("SERA_COORDINATOR", "h:1")
    monkeypatch.setenv("SERA_NUM_PROCESSES", "2")
    monkeypatch.setenv("SERA_PROCESS_ID", "1")
    assert distributed_settings() == ("h:1", 2, 1)


def _groups(seed: int, n_groups: int, per_group: int, *, depths=(0, 1, 2), rubric: bool = False) -> list:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        ds = random_datums(rng, per_group, max_len=90)
        ds = [dataclasses.replace(d, traj_depth=int(rng.choice(depths)), traj_start=int(rng.integers(0, 2)),
                                  objective="rubric_generation" if rubric else d.objective,
                                  reward=float(rng.normal()) if rubric else d.reward)
              for d in ds]
        groups.append(GroupCredit(ds, True))
    return groups


def _figures(groups, *, stop=0, rubric=False):
    return local_figures(stage="rubric_generation" if rubric else "execution", version=3, groups=groups,
                         stats={"trees": 4 * len(groups)}, trees=[], rubric_step_scope=rubric,
                         times={"time/rollout_s": 1.0}, generation={}, efficiency={}, stop=stop)


@pytest.mark.parametrize("gamma", [None, 0.5])
def test_depth_weights_of_a_share_under_the_step_histogram_equal_the_whole_steps(gamma):
    whole = [d for g in _groups(1, 4, 6) for d in g.datums]
    a, b = whole[:10], whole[10:]
    shared = SharedStep([_figures([GroupCredit(a, True)]), _figures([GroupCredit(b, True)])])
    expect = [d.advantage * d.weight for d in apply_depth_weights(whole, gamma=gamma)]
    got = [d.advantage * d.weight for part in (a, b) for d in apply_depth_weights(part, gamma=gamma,
                                                                                 histogram=shared.depth_histogram())]
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    # weighting each share on its own would not: the shares' depth mixes differ
    alone = [d.advantage * d.weight for part in (a, b) for d in apply_depth_weights(part, gamma=gamma)]
    assert not np.allclose(alone, expect)


def test_step_scope_rubric_credit_of_the_shares_equals_the_whole_steps():
    groups = _groups(2, 3, 4, rubric=True)
    whole = step_rubric_credit(groups, -1.0)
    mine, theirs = groups[:2], groups[2:]
    shared = SharedStep([_figures(mine, rubric=True), _figures(theirs, rubric=True)])
    pool, off0 = shared.rubric_pool(0)
    _, off1 = shared.rubric_pool(1)
    assert pool == step_rubric_rewards(groups) and (off0, off1) == (0, 8)
    split = step_rubric_credit(mine, -1.0, pool=pool, offset=off0) + step_rubric_credit(theirs, -1.0, pool=pool,
                                                                                        offset=off1)
    assert [d.advantage for g in split for d in g.datums] == [d.advantage for g in whole for d in g.datums]
    with pytest.raises(ValueError, match="offset"):
        step_rubric_credit(theirs, -1.0, pool=pool, offset=0)


def test_shared_batch_rows_hold_exactly_the_whole_steps_tokens_and_one_shape():
    method = method_config("sera")
    groups = _groups(3, 4, 7)
    shares = [groups[:1], groups[1:]]  # uneven: one process packs far fewer datums
    shared = SharedStep([_figures(s) for s in shares])
    local_counts = []

    def agree(n):  # what the exchange would return: the largest local micro-batch count
        local_counts.append(n)
        return n if len(local_counts) < 2 else max(local_counts)

    kw = dict(min_trainable=2, token_budget=512, buckets=(64, 128, 256), row_multiple=4, warmed_micro_batches=())
    # each side needs the other's count: pack twice (as the gather would give both the maximum)
    for s in shares:
        build_shared_batch(s, shared, method, agree=agree, **kw)
    top = max(local_counts)
    parts = [build_shared_batch(s, shared, method, agree=lambda n: top, **kw) for s in shares]
    (b0, i0), (b1, i1) = parts
    assert b0.tokens.shape == b1.tokens.shape  # every process packs the same [M, rows / P, T]
    assert i0 == i1 and i0["rows"] == 2 * b0.tokens.shape[1]
    whole, info = build_batch(groups, method, **kw)
    assert info["trainable_datums"] == i0["trainable_datums"] and info["loss_tokens"] == i0["loss_tokens"]
    assert int(b0.num_tokens[0]) == int(b1.num_tokens[0]) == int(whole.num_tokens[0])  # the step's token mean

    def trained(b):
        m = np.asarray(b.loss_mask) > 0
        return sorted(zip(np.asarray(b.targets)[m].tolist(), np.round(np.asarray(b.advantages)[m], 6).tolist(),
                          np.round(np.asarray(b.old_logprobs)[m], 6).tolist()))

    assert sorted(trained(b0) + trained(b1)) == trained(whole)
    assert b0.tokens.shape[2] == whole.tokens.shape[2]  # T from the step's longest sequence


def test_the_skip_rule_and_a_stop_are_decided_from_every_process_figures():
    groups = _groups(4, 2, 3)
    shared = SharedStep([_figures(groups[:1]), _figures(groups[1:], stop=15)])
    assert shared.stop == 15 and shared.stopped_by == [1] and shared.groups == 2
    few = SharedStep([_figures([GroupCredit(groups[0].datums[:1], True)]), _figures([])])
    batch, info = build_shared_batch([], few, method_config("sera"), min_trainable=2, token_budget=512, buckets=(64, 128),
                                     row_multiple=2, warmed_micro_batches=(), agree=lambda n: n)
    assert batch is None and "1 trainable datums < 2" in info["reason"]


def test_the_data_order_of_each_rank_comes_from_the_process_that_runs_it():
    streams = [TaskStream(50, seed=1, ranks=4) for _ in range(2)]
    for p, s in enumerate(streams):
        for r in deal_ranks(4, p, 2):
            for _ in range(3 + r):
                s.next(r)
        s.requeue(deal_ranks(4, p, 2)[0], [p + 100])
    merged = TaskStream.from_json(merge_streams([s.to_json() for s in streams], 4))
    whole = TaskStream(50, seed=1, ranks=4)
    for r in range(4):
        for _ in range(3 + r):
            whole.next(r)
    whole.requeue(0, [100])
    whole.requeue(2, [101])
    assert merged.to_json() == whole.to_json()
    with pytest.raises(ValueError, match="ranks"):
        merge_streams([s.to_json() for s in streams], 8)
