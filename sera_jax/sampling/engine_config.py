"""The rollout engine's sizes and static-shape buckets.

Every device call has a shape drawn from a small fixed set, so after ``Engine.warmup()`` (or once each bucket has been
seen) no mix of requests compiles anything new:

* decode chunks: ``[b rows, W table blocks]`` with ``b`` in ``batch_buckets`` and ``W`` in ``width_buckets``;
* prefill calls: ``[B rows, T tokens]`` with ``B`` in ``prefill_batch_buckets`` and ``T`` in ``prefill_len_buckets``
  (prompts longer than the largest ``T`` are prefilled in pieces, each a continuation past the cached part), whose
  attention reads ``C`` blocks of cached context, ``C`` in ``prefill_ctx_buckets`` (0: a first prefill reads none).

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

    Measured on ``tools/bench_decode.py``'s workload (the tiny policy replaying a real evaluation's turns, 2 cores):

    * Prefill reads only a row's cached context (``prefill_ctx_buckets``: none, a quarter, a half or the whole
      table), not the whole table: the workload's prefill time halved (3.8 → 1.9 s for 32 agents). Prefill pieces
      are at most 512 tokens in 64/128/256/512 buckets; finer length buckets (32..384) computed less but compiled 12
      more shapes, a wash on the 147-task evaluation (69.5 vs 72 s). Prefill batches stay at 2: 4 rows was slower.
    * Decode rows come in powers of two from 4 up to ``max_batch`` (an evaluation at concurrency 16 keeps ~8 of its
      32 rows decoding), and a round's rows are split into up to four chunks by the width they need (a quarter, a
      half or the whole table), at the cut points of least modelled cost (``scheduler.DECODE_*``): a decode step
      reads each row's whole window, so short rows should not pay for the longest, and padding rows cost as much as
      live ones: only 39% of the window columns a round read were live with 8/16/32 rows and two chunks.
    * Two prefill calls a round: with one, ~4 of the 16 agents waited in the queue at any time, their turns done
      but not yet admitted; with two, ~2 (and ~7.8 rows decode instead of ~6.6).

    These two took the replay from 6.0 to 5.0 s (after the reference attention's batched-matmul layout, 7.7 → 6.0 s).
    """
    max_prefill = min(512, max_context)
    lens = tuple(n for n in (64, 128, 256) if n < max_prefill) + (max_prefill,)
    rows = tuple(1 << k for k in range(2, max(2, (max_batch - 1).bit_length())) if 1 << k < max_batch) + (max_batch,)
    width = math.ceil(max_context / block_size)
    ctx = tuple(sorted({0, width, *(width >> k for k in (2, 1) if width >> k)}))
    return dict(batch_buckets=rows, width_buckets=ctx[1:], decode_groups=4, prefill_ctx_buckets=ctx,
                prefill_batch_buckets=(2,), max_prefill_batch=2, prefill_calls=2, prefill_len_buckets=lens,
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
    decode_groups: int = 1  # decode calls per round at most, each over rows of similar context length
    prefill_calls: int = 1  # prefill calls per round at most (each up to max_prefill_batch rows)
    # False (default): the host parses round k as soon as it ends, then dispatches round k+1 with the finished rows'
    # slots freed and the turns that arrived during round k admitted; the finished turns are handed back after that
    # dispatch, so their agents' host work overlaps round k+1. The device waits for the parse and the dispatch (~1-2%
    # of a round here). True: round k+1 is dispatched before round k is parsed, so the device never waits, but a turn
    # that ends in round k is known only once round k+1 is queued and its agent's next turn waits a round longer; on
    # agent trees that cost more than it saved (issue #34: tools/bench_job.py --dispatch-ahead yes).
    dispatch_ahead: bool = False
    max_prefill_len: int = 2048  # tokens of one request per prefill call (longer prompts go in pieces)
    max_prefill_batch: int = 8
    max_prefill_tokens: int = 8192  # rows × padded length of one prefill call
    min_prefill_len: int = 16
    max_stop_ids: int = 4
    # Stop strings end a row on device too: token sequences the host has seen complete one (``scheduler``), up to
    # ``max_stop_seqs`` per request of at most ``stop_seq_len`` tokens, matched against each row's last tokens.
    max_stop_seqs: int = 2
    stop_seq_len: int = 8
    dtype: str = "bfloat16"
    prefix_caching: bool = True  # False: every prompt is computed in full (for benchmarks and A/B checks)
    batch_buckets: tuple[int, ...] = ()  # default: powers of two up to max_batch
    prefill_batch_buckets: tuple[int, ...] = ()  # default: powers of two up to max_prefill_batch
    prefill_len_buckets: tuple[int, ...] = ()  # default: powers of two from min_prefill_len to max_prefill_len
    width_buckets: tuple[int, ...] = ()  # default: powers of two up to the blocks of max_context
    # Blocks of cached context a prefill call's attention reads (0 allowed: a first prefill reads none). Default:
    # the whole table only (the Pallas kernel reads just the live blocks anyway); the CPU reference sets a few.
    prefill_ctx_buckets: tuple[int, ...] = ()
    compiler_options: tuple[tuple[str, object], ...] = ()
    # The most likely tokens computed beside each generated one, for requests that ask for ``top_logprobs`` (a
    # server's; OpenAI allows up to 20). 0, the default for training and evaluation: the programs compute none.
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        errors = []
        for name in ("max_batch", "block_size", "num_blocks", "max_context", "chunk_steps", "decode_groups",
                     "prefill_calls", "max_prefill_len",
                     "max_prefill_batch", "max_prefill_tokens", "min_prefill_len"):
            if getattr(self, name) <= 0:
                errors.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.top_logprobs < 0:
            errors.append(f"top_logprobs must be ≥ 0, got {self.top_logprobs}")
        if self.max_stop_ids < 0 or self.max_stop_seqs < 0:
            errors.append("max_stop_ids and max_stop_seqs must be ≥ 0")
        if self.stop_seq_len < 1:
            errors.append(f"stop_seq_len must be ≥ 1, got {self.stop_seq_len}")
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
        """Returns the resolved buckets {"batch", "prefill_batch", "prefill_len", "width", "prefill_ctx"} for a
        mesh data size."""
        def rounded(bs):
            return tuple(sorted({math.ceil(b / data_size) * data_size for b in bs}))

        batch = rounded(self.batch_buckets or _pow2_upto(1, self.max_batch))
        pbatch = rounded(self.prefill_batch_buckets or _pow2_upto(1, self.max_prefill_batch))
        plen = tuple(sorted(self.prefill_len_buckets)) or _pow2_upto(
            min(self.min_prefill_len, self.max_prefill_len), self.max_prefill_len)
        width = tuple(sorted(self.width_buckets)) or _pow2_upto(1, self.max_blocks_per_seq)
        if width[-1] < self.max_blocks_per_seq:
            width = width + (self.max_blocks_per_seq,)
        ctx = tuple(sorted(set(self.prefill_ctx_buckets))) or (self.max_blocks_per_seq,)
        if ctx[0] < 0:
            raise ValueError(f"prefill_ctx_buckets must be ≥ 0, got {ctx}")
        if ctx[-1] < self.max_blocks_per_seq:
            ctx = ctx + (self.max_blocks_per_seq,)
        if pbatch[-1] < self.max_prefill_batch or batch[-1] < self.max_batch:
            raise ValueError("batch buckets must reach max_batch and prefill batch buckets max_prefill_batch")
        if plen[-1] < self.max_prefill_len:
            raise ValueError(f"prefill_len_buckets must reach max_prefill_len={self.max_prefill_len}")
        return {"batch": batch, "prefill_batch": pbatch, "prefill_len": plen, "width": width, "prefill_ctx": ctx}
