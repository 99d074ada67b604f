"""The step's shapes in one place: buckets, rows per micro-batch, the micro-batch count, and the [M, B, T] shapes
the warm-up compiles, which must be the shapes packing and stacking produce."""

from __future__ import annotations

import numpy as np
import pytest

from rl_builders import random_datums
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.shapes import (
    bucket_length, micro_batch_count, next_power_of_two, rows_per_micro_batch, step_shapes,
)


def test_bucket_length():
    assert bucket_length(1) == 256 and bucket_length(256) == 256 and bucket_length(257) == 512
    assert bucket_length(5, (8, 4)) == 8
    with pytest.raises(ValueError):
        bucket_length(20_000)


def test_rows_and_powers():
    assert rows_per_micro_batch(1000, 200) == 5 and rows_per_micro_batch(100, 200) == 1
    assert rows_per_micro_batch(1000, 200, row_groups=4) == 20
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 4, 5, 9)] == [1, 1, 2, 4, 4, 8, 16]
    assert micro_batch_count(3, (1, 2, 3, 4)) == 3 and micro_batch_count(3) == 4


def test_packed_and_stacked_batches_have_a_warmed_shape():
    from sera_jax.training.step import stack_micro_batches

    rng = np.random.default_rng(0)
    warmed = (1, 2, 3, 4)
    shapes = set(step_shapes(256, (32, 64), row_groups=2, micro=warmed))
    for n in (3, 17, 40):
        packed = pack_datums(random_datums(rng, n), token_budget=256, buckets=(32, 64), row_groups=2)
        batch = stack_micro_batches(packed.micro_batches, row_multiple=2,
                                    num=micro_batch_count(len(packed.micro_batches), warmed))
        assert tuple(batch.tokens.shape) in shapes
