"""Packed micro-batches give the tiny Qwen3 the same per-token logprobs as each sequence run alone."""

from __future__ import annotations

import jax
import numpy as np

from rl_builders import random_datums
from sera_jax.model import token_logprobs
from sera_jax.rl.batch import pack_datums


def test_packed_logprobs_equal_unpacked(tiny_qwen):
    cfg, params, _ = tiny_qwen
    ds = random_datums(np.random.default_rng(11), 12, max_len=40)
    step = pack_datums(ds, token_budget=128, buckets=(64,))
    assert len(step.micro_batches) >= 2 and max(int(mb.segment_ids.max()) for mb in step.micro_batches) >= 3
    lp_fn = jax.jit(lambda p, t, y, s, pos: token_logprobs(p, cfg, t, y, s, pos))
    packed = [np.asarray(lp_fn(params, mb.tokens, mb.targets, mb.segment_ids, mb.positions))
              for mb in step.micro_batches]
    # Unpacked: one sequence per row from position 0, right-padded (causal attention never sees the padding).
    width = max(len(d.tokens) for d in ds)
    rows = np.zeros((len(ds), width), np.int32)
    for i, d in enumerate(ds):
        rows[i, :len(d.tokens)] = d.tokens
    alone = np.asarray(jax.jit(lambda p, t, y: token_logprobs(p, cfg, t, y))(params, rows[:, :-1], rows[:, 1:]))
    for i, (b, r, s, n) in enumerate(step.placements):
        np.testing.assert_allclose(packed[b][r, s:s + n], alone[i, :n], rtol=1e-5, atol=1e-5)
    # The segment ids are what isolates neighbours: without them a later sequence's logprobs change.
    b, r, s, n = next(p for p in step.placements if p[2] > 0)
    mb = step.micro_batches[b]
    leaked = np.asarray(lp_fn(params, mb.tokens, mb.targets, (mb.segment_ids > 0).astype(np.int32),
                              mb.positions))[r, s:s + n]
    assert not np.allclose(leaked, packed[b][r, s:s + n], atol=1e-4)
