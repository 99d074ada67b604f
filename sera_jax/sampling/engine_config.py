"""The rollout engine's sizes and static-shape buckets.

Every device call has a shape drawn from a small fixed set, so after ``Engine.warmup()`` (or once each bucket has been
seen) no mix of requests compiles anything new:

* decode chunks: ``[b rows, W table blocks]`` with ``b`` in ``batch_buckets`` and ``W`` in ``width_buckets``;
* prefill calls: ``[B rows, T tokens]`` with ``B`` in ``prefill_batch_buckets`` and ``T`` in ``prefill_len_buckets``
  (prompts longer than the largest ``T`` are prefilled in pieces, each a continuation past the cached part), and a
  table as wide as the longest sequence (prefill is compute-bound; the extra masked columns are cheap).

Batch buckets are rounded up to multiples of the mesh's ``data`` size, because SAMPLE_RULES split rows over it.
"""

from __future__ import annotations

import dataclasses
import math


def _pow2_upto(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], max(1, lo)
    while v < hi:
        out.append(v)
        v *= 2
    out.append(hi)
    return tuple(sorted(set(out)))


def pick_bucket(buckets: tuple[int, ...], n: int) -> int:
    """Returns the smallest bucket ≥ n (raises ValueError if none is)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def cpu_shapes(max_batch: int, max_context: int, block_size: int = 16) -> dict[str, object]:
    """Returns the EngineConfig fields for the reference (CPU) backend: few shapes, because each compiles in seconds
    there, and prefill pieces of at most 512 tokens in short length buckets.

    The reference prefill attends over the whole table width, so its cost grows with (piece length × context): a
    (2 × 1,024) prefill call of the tiny policy took 716 ms against 238 ms for (2 × 512) and 19 ms for (2 × 128), and
    a 48-task evaluation went from 105 s (buckets 512/1,024) to 60 s (64/128/256/512) with the same tokens. Decode
    rows come in powers of two from 8 up to ``max_batch``: an evaluation at concurrency 16 keeps ~8 of its 32 rows
    live, and computing only the live slots' bucket took ``tools/bench_decode.py``'s workload from 594 to 954
    tokens/s for one more compiled shape. Decode keeps one width (the full table): width buckets of 512/1,024 tokens
    measured no faster (a batch holds some long context almost always). Prefill batches stay at 2: 8 rows padded to
    the whole width was slower (613 tokens/s).
    """
    max_prefill = min(512, max_context)
    lens = tuple(n for n in (64, 128, 256) if n < max_prefill) + (max_prefill,)
    rows = tuple(1 << k for k in range(3, max(3, (max_batch - 1).bit_length())) if 1 << k < max_batch) + (max_batch,)
    return dict(batch_buckets=rows, width_buckets=(math.ceil(max_context / block_size),),
                prefill_batch_buckets=(2,), max_prefill_batch=2, prefill_len_buckets=lens,
                max_prefill_len=max_prefill, max_prefill_tokens=max(8192, 2 * max_prefill))


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Sizes of the rollout engine. ``dtype`` is the sampler's weight/activation/KV dtype (bf16 on GPU).

    ``compiler_options`` are passed to ``jax.jit`` for the engine's device functions, as (name, value) pairs (tests
    use XLA's fast-compile settings; leave empty for speed).
    """

    max_batch: int = 32  # decode rows
    block_size: int = 16
    num_blocks: int = 1024  # including the reserved trash block
    max_context: int = 4096  # prompt + completion tokens per request
    chunk_steps: int = 16  # decode steps per device call
    max_prefill_len: int = 2048  # tokens of one request per prefill call (longer prompts go in pieces)
    max_prefill_batch: int = 8
    max_prefill_tokens: int = 8192  # rows × padded length of one prefill call
    min_prefill_len: int = 16
    max_stop_ids: int = 4
    dtype: str = "bfloat16"
    prefix_caching: bool = True  # False: every prompt is computed in full (for benchmarks and A/B checks)
    batch_buckets: tuple[int, ...] = ()  # default: powers of two up to max_batch
    prefill_batch_buckets: tuple[int, ...] = ()  # default: powers of two up to max_prefill_batch
    prefill_len_buckets: tuple[int, ...] = ()  # default: powers of two from min_prefill_len to max_prefill_len
    width_buckets: tuple[int, ...] = ()  # default: powers of two up to the blocks of max_context
    compiler_options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        errors = []
        for name in ("max_batch", "block_size", "num_blocks", "max_context", "chunk_steps", "max_prefill_len",
                     "max_prefill_batch", "max_prefill_tokens", "min_prefill_len"):
            if getattr(self, name) <= 0:
                errors.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_stop_ids < 0:
            errors.append("max_stop_ids must be ≥ 0")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            errors.append(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.num_blocks < 2:
            errors.append("num_blocks must be ≥ 2 (block 0 is the reserved trash block)")
        if errors:
            raise ValueError("invalid EngineConfig: " + "; ".join(errors))

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_context / self.block_size)

    def buckets(self, data_size: int = 1) -> dict[str, tuple[int, ...]]:
        """Returns the resolved buckets {"batch", "prefill_batch", "prefill_len", "width"} for a mesh data size."""
        def rounded(bs):
            return tuple(sorted({math.ceil(b / data_size) * data_size for b in bs}))

        batch = rounded(self.batch_buckets or _pow2_upto(1, self.max_batch))
        pbatch = rounded(self.prefill_batch_buckets or _pow2_upto(1, self.max_prefill_batch))
        plen = tuple(sorted(self.prefill_len_buckets)) or _pow2_upto(
            min(self.min_prefill_len, self.max_prefill_len), self.max_prefill_len)
        width = tuple(sorted(self.width_buckets)) or _pow2_upto(1, self.max_blocks_per_seq)
        if width[-1] < self.max_blocks_per_seq:
            width = width + (self.max_blocks_per_seq,)
        if pbatch[-1] < self.max_prefill_batch or batch[-1] < self.max_batch:
            raise ValueError("batch buckets must reach max_batch and prefill batch buckets max_prefill_batch")
        if plen[-1] < self.max_prefill_len:
            raise ValueError(f"prefill_len_buckets must reach max_prefill_len={self.max_prefill_len}")
        return {"batch": batch, "prefill_batch": pbatch, "prefill_len": plen, "width": width}
