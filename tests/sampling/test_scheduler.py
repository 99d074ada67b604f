"""The scheduler's host decisions, without a device: the decode split into width classes, prefill admission."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sera_jax.sampling import EngineConfig, SamplingParams
from sera_jax.sampling.request import make_request
from sera_jax.sampling.scheduler import Scheduler


def scheduler(**overrides) -> Scheduler:
    base = dict(max_batch=16, block_size=8, num_blocks=400, max_context=256, chunk_steps=8, max_prefill_len=64,
                max_prefill_batch=2, max_prefill_tokens=256, dtype="float32", batch_buckets=(2, 4, 8, 16),
                prefill_batch_buckets=(2,), prefill_len_buckets=(16, 64), width_buckets=(4, 8, 16, 32))
    base.update(overrides)
    ec = EngineConfig(**base)
    return Scheduler(ec, ec.buckets())


def request(rid: int, n_prompt: int, max_new: int = 8):
    rs = np.random.RandomState(rid)
    return make_request(rid, rs.randint(0, 50, n_prompt).tolist(), SamplingParams(max_new_tokens=max_new,
                        temperature=0.0), None, vocab_size=50, max_context=256, max_stop_ids=4, block_size=8,
                        capacity_blocks=399, has_tokenizer=False, fallback_key=(0, rid))


def brute_force(sched: Scheduler, order, need, groups):
    """The least modelled cost over every cut of ``order`` into ≤ ``groups`` consecutive groups."""
    best = float("inf")
    for k in range(groups):
        for cuts in itertools.combinations(range(1, len(order)), k):
            bounds = (0,) + cuts + (len(order),)
            best = min(best, sum(sched.chunk_cost(order[a:b], need) for a, b in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_decode_split_is_the_least_cost_cut(groups, seed):
    sched = scheduler(decode_groups=groups)
    rs = np.random.RandomState(seed)
    n = rs.randint(1, 17)
    need = {slot: int(rs.choice([1, 3, 4, 7, 9, 16, 20, 31])) for slot in range(n)}
    order = sorted(need, key=lambda slot: (need[slot], slot))
    split = sched._split(order, need)
    assert [s for g in split for s in g] == order and all(split) and len(split) <= groups
    assert sum(sched.chunk_cost(g, need) for g in split) == brute_force(sched, order, need, groups)


def test_short_and_long_rows_decode_in_separate_chunks_of_their_own_width():
    sched = scheduler(decode_groups=3)
    lengths = [10, 12, 9, 11, 13, 10, 12, 14, 230, 240, 235, 238]
    for rid, n in enumerate(lengths):
        sched.add(request(rid, n))
    while sched.waiting or any(r is not None and not r.decoding for r in sched.slots):
        sched.prefill_dispatched(sched.plan_prefill())
    chunks = sched.plan_decode()
    widths = sorted(c.table.shape[1] for c in chunks)
    assert widths == [4, 32], widths  # 3 and 31 blocks needed (prompt + 8 steps)
    for c in chunks:
        live = [r for r, alive in zip(c.snapshot, c.alive) if alive]
        assert all(len(r.prompt) + 8 <= c.table.shape[1] * 8 for r in live)


def test_each_prefill_call_takes_its_own_waiting_requests():
    sched = scheduler()
    for rid in range(5):
        sched.add(request(rid, 20))
    first, second = sched.plan_prefill(), None
    sched.prefill_dispatched(first)
    second = sched.plan_prefill()
    sched.prefill_dispatched(second)
    a = [r.rid for r, _ in first.members]
    b = [r.rid for r, _ in second.members]
    assert a == [0, 1] and b == [2, 3] and [r.rid for r in sched.waiting] == [4]


def test_a_row_the_device_ended_retires_even_when_its_chunk_returns_no_token():
    # A row can end on device on the last step of a chunk, on a learned stop sequence the host's text check does not
    # confirm: the next chunk returns no token for it. It must retire then (one round late), not wait forever; a row
    # given every step of its chunk is still running.
    sched = scheduler()
    for rid in range(2):
        sched.add(request(rid, 20, max_new=64))
    batch = sched.plan_prefill()
    sched.prefill_dispatched(batch)
    assert not sched.on_prefill_output(batch, np.array([5, 6]), np.zeros(2), ended=np.array([False, False]))
    (chunk,) = sched.plan_decode()
    live = [i for i, alive in enumerate(chunk.alive) if alive]
    assert len(live) == 2
    out = np.full((len(chunk.index), 8), -1, np.int32)
    out[live[1]] = 7  # the second row ran the whole chunk; the first produced nothing
    done = sched.on_decode_output(chunk, out, np.zeros(out.shape, np.float32))
    assert [(req.rid, res.finish_reason) for req, res in done] == [(chunk.snapshot[live[0]].rid, "stop_string")]
    assert sched.stats["stop_unconfirmed"] == 1
    assert not chunk.snapshot[live[1]].finished and len(chunk.snapshot[live[1]].tokens) == 9
