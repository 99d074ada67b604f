"""The shapes of a training step, in one place: the row length T a packed batch is bucketed to, the rows of one
micro-batch, the micro-batch count M a step's micro-batches are padded to, and the [M, B, T] shapes the loop can
build (what the warm-up compiles). ``rl.batch`` packs to these; the trainer stacks and warms them.

Fixed shapes are what keep a step from recompiling: T comes from a short list of buckets, B follows from the
token budget and T, and M is either a count the warm-up compiled or a power of two (so first-use compiles stay
few).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_BUCKETS", "bucket_length", "rows_per_micro_batch", "next_power_of_two", "micro_batch_count",
           "step_shapes"]

DEFAULT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384)


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Returns the smallest bucket ≥ n; raises ValueError when n exceeds the largest bucket."""
    for b in sorted(buckets):
        if b >= n:
            return b
    raise ValueError(f"sequence of {n} positions exceeds the largest bucket {max(buckets)}")


def rows_per_micro_batch(token_budget: int, row_len: int, row_groups: int = 1) -> int:
    """Returns the rows B of one micro-batch of rows of ``row_len``: ``max(1, token_budget // row_len)`` per device,
    times the ``row_groups`` devices that share a micro-batch's rows (the budget is per device, like the reference's
    per-rank ``max_tokens_per_mb``)."""
    return max(1, token_budget // row_len) * row_groups


def next_power_of_two(n: int) -> int:
    """Returns the smallest power of two ≥ ``n`` (1 for n ≤ 1)."""
    return 1 << max(n - 1, 0).bit_length()


def micro_batch_count(n: int, warmed: Sequence[int] = ()) -> int:
    """Returns the micro-batch count M that ``n`` packed micro-batches are padded to: the smallest warmed count ≥
    ``n`` (the warm-up compiled the step for it, and 3 run as 3, not as 4 with an empty one), else the next power of
    two (compiled on first use; powers keep those compiles few)."""
    fits = [m for m in warmed if m >= n]
    return min(fits) if fits else next_power_of_two(n)


def step_shapes(token_budget: int, buckets: Sequence[int], row_groups: int, micro: Sequence[int] = (1, 2)
                ) -> list[tuple[int, int, int]]:
    """Returns the stacked batch shapes [M, B, T] the loop builds (``rl.batch.pack_datums`` with ``row_groups``
    devices per micro-batch; ``micro_batch_count`` pads M to the smallest of ``micro`` that holds it): every bucket
    T, each M of ``micro``."""
    return [(m, rows_per_micro_batch(token_budget, t, row_groups), t) for t in sorted(buckets) for m in micro]
