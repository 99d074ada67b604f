"""Packing datums into fixed-shape micro-batches (segment ids, positions, shifted masks, global token count)."""

from __future__ import annotations

import numpy as np
import pytest

from sera_jax.rl.batch import count_loss_tokens, pack_datums
from sera_jax.rl.datums import Datum
from rl_builders import random_datums


def _datum(tokens, mask, logprobs, versions, advantage, weight=1.0):
    return Datum(tokens=tokens, mask=mask, logprobs=logprobs, versions=versions, reward=advantage,
                 objective="execution", traj_depth=0, traj_start=1, advantage=advantage, weight=weight)


def test_every_datum_lands_intact_with_segments_positions_and_shifted_arrays():
    rng = np.random.default_rng(0)
    ds = random_datums(rng, 23)
    step = pack_datums(ds, token_budget=256, buckets=(64, 128))
    T = 64
    assert all(mb.tokens.shape == (4, T) for mb in step.micro_batches)  # 256 // 64 rows, all micro-batches
    assert step.num_tokens == count_loss_tokens(ds) == sum(sum(d.mask[1:]) for d in ds)
    assert all(int(mb.num_tokens) == step.num_tokens for mb in step.micro_batches)
    seen_cells = np.zeros((len(step.micro_batches), 4, T), int)
    for d, (b, r, s, n) in zip(ds, step.placements):
        mb = step.micro_batches[b]
        sl = slice(s, s + n)
        assert n == len(d.tokens) - 1
        np.testing.assert_array_equal(mb.tokens[r, sl], d.tokens[:-1])
        np.testing.assert_array_equal(mb.targets[r, sl], d.tokens[1:])
        np.testing.assert_array_equal(mb.positions[r, sl], np.arange(n))
        np.testing.assert_array_equal(mb.loss_mask[r, sl], d.mask[1:])
        np.testing.assert_allclose(mb.advantages[r, sl], np.float32(d.advantage) * np.asarray(d.mask[1:]))
        np.testing.assert_allclose(mb.old_logprobs[r, sl], np.asarray(d.logprobs[1:], np.float32))
        seg = np.asarray(mb.segment_ids[r, sl])
        assert seg.min() == seg.max() >= 1
        seen_cells[b, r, sl] += 1
    assert seen_cells.max() == 1  # no overlap
    for b, mb in enumerate(step.micro_batches):
        pad = seen_cells[b] == 0
        seg = np.asarray(mb.segment_ids)
        assert np.all(seg[pad] == 0) and np.all(np.asarray(mb.loss_mask)[pad] == 0)
        assert np.all(np.asarray(mb.advantages)[pad] == 0)
        for row in seg:  # segment ids count 1, 2, ... along a row
            ids = [int(x) for x in row if x]
            assert ids == sorted(ids) and (not ids or set(ids) == set(range(1, max(ids) + 1)))


def test_shapes_are_static_across_steps():
    rng = np.random.default_rng(1)
    shapes = {mb.tokens.shape for k in range(5)
              for mb in pack_datums(random_datums(rng, int(rng.integers(1, 30))), token_budget=1024,
                                    buckets=(128, 256)).micro_batches}
    assert shapes == {(8, 128)}
    fixed = pack_datums(random_datums(rng, 3, max_len=10), token_budget=1000, row_len=200)
    assert fixed.micro_batches[0].tokens.shape == (5, 200)


def test_budget_and_edge_cases():
    rng = np.random.default_rng(2)
    ds = random_datums(rng, 40)
    step = pack_datums(ds, token_budget=300, buckets=(64,))
    for mb in step.micro_batches:
        assert mb.tokens.size <= 300
    short = _datum((7,), (1,), (-0.1,), (3,), 1.0)
    s2 = pack_datums([short] + ds[:2], token_budget=300, buckets=(64,))
    assert s2.placements[0] == (-1, -1, -1, 0)
    assert s2.num_tokens == count_loss_tokens(ds[:2])
    assert pack_datums(ds[:2], num_tokens=999).num_tokens == 999
    with pytest.raises(ValueError):
        pack_datums(ds, row_len=8)
    empty = pack_datums([], token_budget=512, buckets=(256,))
    assert len(empty.micro_batches) == 1 and int(empty.micro_batches[0].num_tokens) == 0


def test_advantages_clip_at_20_by_default():
    big = _datum((1, 2, 3), (0, 1, 1), (0.0, -0.1, -0.2), (-1, 1, 1), 35.0)
    neg = _datum((1, 2), (0, 1), (0.0, -0.1), (-1, 1), -21.0)
    step = pack_datums([big, neg], buckets=(8,))
    adv = np.asarray(step.micro_batches[0].advantages)
    assert adv.max() == 20.0 and adv.min() == -20.0
    raw = np.asarray(pack_datums([big], buckets=(8,), advantage_clip=None).micro_batches[0].advantages)
    assert raw.max() == 35.0


def test_a_datum_trains_on_its_advantage_times_its_weight_clipped():
    d = _datum((1, 2, 3), (0, 1, 1), (0.0, -0.1, -0.2), (-1, 1, 1), 0.3, weight=1.7)
    adv = np.asarray(pack_datums([d], buckets=(8,)).micro_batches[0].advantages)[0, :2]
    assert list(adv) == [np.float32(0.3 * 1.7)] * 2
    heavy = _datum((1, 2), (0, 1), (0.0, -0.1), (-1, 1), -4.0, weight=6.0)   # −24 after weighting: clipped
    assert np.asarray(pack_datums([heavy], buckets=(8,)).micro_batches[0].advantages).min() == -20.0
    unbased = Datum(tokens=(1, 2), mask=(0, 1), logprobs=(0.0, -0.1), versions=(-1, 1), reward=1.0,
                    objective="execution", traj_depth=0, traj_start=1)
    with pytest.raises(ValueError, match="no advantage"):
        pack_datums([unbased], buckets=(8,))



def test_micro_batch_fields_match_their_jaxtyping_annotations():
    import typing

    from sera_jax.rl.batch import MicroBatch

    rng = np.random.default_rng(4)
    mb = pack_datums(random_datums(rng, 5), buckets=(64,)).micro_batches[0]
    hints = typing.get_type_hints(MicroBatch)
    assert set(hints) == {"tokens", "targets", "positions", "segment_ids", "loss_mask", "advantages",
                          "old_logprobs", "num_tokens"}
    def matches(x, hint):  # host (numpy) or device arrays: a union of two jaxtyping types
        return any(isinstance(x, h) for h in (typing.get_args(hint) or (hint,)))

    for name, hint in hints.items():
        assert matches(getattr(mb, name), hint), name
    assert len({getattr(mb, n).shape for n in hints if n != "num_tokens"}) == 1
    assert not matches(mb.loss_mask, hints["tokens"])  # the check is real: float is not Int
    assert not matches(mb.tokens[0], hints["tokens"])  # nor is a [T] row a [B, T] batch


def test_the_token_budget_is_per_device():
    """``row_groups`` devices share a micro-batch's rows: each gets up to ``token_budget`` tokens (the reference's
    per-rank micro-batch), so the micro-batch holds ``row_groups`` times the rows."""
    datums = random_datums(np.random.default_rng(3), 40, max_len=120)
    one = pack_datums(datums, token_budget=256, buckets=(64, 128))
    four = pack_datums(datums, token_budget=256, buckets=(64, 128), row_groups=4)
    assert one.micro_batches[0].tokens.shape == (2, 128) and four.micro_batches[0].tokens.shape == (8, 128)
    assert len(four.micro_batches) == -(-len(one.micro_batches) // 4)
    assert four.num_tokens == one.num_tokens
