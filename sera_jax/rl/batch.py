"""Datums → fixed-shape, packed micro-batches under a token budget (docs/design/algorithm.md §6.1–6.2).

Each datum of L tokens becomes one packed sequence of L − 1 positions (position t predicts token t + 1, so the
loss mask, advantages and behaviour logprobs are those of the *target* token). Sequences are packed first-fit
decreasing into rows of a bucketed length T; a micro-batch is ``rows = max(1, token_budget // T)`` rows per device
(``row_groups`` devices share a micro-batch's rows; both rules live in ``rl.shapes``), so every
micro-batch of a step has the same [B, T] shape and shapes repeat across steps (no recompilation). A trained
position's advantage is its datum's advantage × weight, clipped. Segment ids are
1-based per sequence within a row (0 = padding) and positions restart at 0 for each sequence, which is what the
model's packed attention needs. ``num_tokens`` is the global count of loss-masked tokens of the step, put on every
micro-batch so the losses of the micro-batches add up to the loss of the whole step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.struct
import numpy as np
from jaxtyping import Array, Float, Int

from sera_jax.rl.datums import Datum
from sera_jax.rl.shapes import DEFAULT_BUCKETS, bucket_length, rows_per_micro_batch

__all__ = ["MicroBatch", "PackedStep", "DEFAULT_BUCKETS", "bucket_length", "first_fit_decreasing", "pack_datums",
           "count_loss_tokens"]

# Host (numpy) arrays when packed, device arrays once placed: the step takes either.
HostOrDevice = Array | np.ndarray


@flax.struct.dataclass
class MicroBatch:
    tokens: Int[HostOrDevice, "B T"]          # input token ids
    targets: Int[HostOrDevice, "B T"]         # the next token each position predicts
    positions: Int[HostOrDevice, "B T"]       # restart at 0 for each packed sequence
    segment_ids: Int[HostOrDevice, "B T"]     # 1..k per sequence within a row, 0 = padding
    loss_mask: Float[HostOrDevice, "B T"]     # 1 where the target token is trained
    advantages: Float[HostOrDevice, "B T"]    # the datum's clipped advantage × weight on trained positions, else 0
    old_logprobs: Float[HostOrDevice, "B T"]  # behaviour logprob of the target token
    num_tokens: Int[HostOrDevice, ""]         # loss-masked tokens in the whole step (all micro-batches)


@dataclasses.dataclass(frozen=True)
class PackedStep:
    micro_batches: list[MicroBatch]
    placements: list[tuple[int, int, int, int]]   # per datum: (micro-batch, row, start, length)
    num_tokens: int


def count_loss_tokens(datums: Sequence[Datum]) -> int:
    """Returns the number of trained target positions of the datums (the first token is never a target)."""
    return sum(sum(d.mask[1:]) for d in datums)


def first_fit_decreasing(lengths: Sequence[int], row_len: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Returns ((index, row) in placement order, free positions per row): first-fit decreasing of the positive
    ``lengths`` into rows of ``row_len``, stable on the index so packing is deterministic."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: (-lengths[i], i))
    free: list[int] = []
    placed = []
    for i in order:
        row = next((r for r, f in enumerate(free) if f >= lengths[i]), None)
        if row is None:
            free.append(row_len)
            row = len(free) - 1
        free[row] -= lengths[i]
        placed.append((i, row))
    return placed, free


def pack_datums(datums: Sequence[Datum], *, token_budget: int = 60_000,
                buckets: Sequence[int] = DEFAULT_BUCKETS, row_len: int | None = None,
                num_tokens: int | None = None, pad_id: int = 0, advantage_clip: float | None = 20.0,
                row_groups: int = 1) -> PackedStep:
    """Returns the datums packed into equal-shape micro-batches of ``row_groups`` groups of at most ``token_budget``
    tokens each: ``row_groups`` is the mesh's batch split (the devices a micro-batch's rows are spread over), so the
    budget is per device, like the reference's per-rank ``max_tokens_per_mb``.

    ``row_len`` fixes T (else the smallest bucket holding the longest sequence); ``num_tokens`` overrides the
    global loss-token count (pass the all-ranks total when each rank packs only its share). Each datum trains on its
    advantage × weight, clipped to ±``advantage_clip`` (the reference trainer's default of 20; None = no clip); a
    datum without an advantage (no baseline ran) is refused with ValueError. Datums with fewer than two tokens
    carry no target and are left out (their placement is (-1, -1, -1, 0)).
    """
    lengths = [max(len(d.tokens) - 1, 0) for d in datums]
    longest = max(lengths, default=1)
    T = row_len if row_len is not None else bucket_length(max(longest, 1), buckets)
    if longest > T:
        raise ValueError(f"sequence of {longest} positions does not fit rows of {T}")
    rows_per_micro = rows_per_micro_batch(token_budget, T, row_groups)

    rows_of, free = first_fit_decreasing(lengths, T)
    nseg = [0] * len(free)
    used = [0] * len(free)
    where: dict[int, tuple[int, int, int]] = {}
    for i, row in rows_of:  # placement order
        nseg[row] += 1  # sequences sit left to right in placement order, so ids rise along the row
        where[i] = (row, used[row], nseg[row])
        used[row] += lengths[i]

    n_micro = max(1, -(-len(free) // rows_per_micro))
    shape = (n_micro * rows_per_micro, T)
    arr = {k: np.zeros(shape, np.int32) for k in ("tokens", "targets", "positions", "segment_ids")}
    arr["tokens"][:] = pad_id
    arr["targets"][:] = pad_id
    flt = {k: np.zeros(shape, np.float32) for k in ("loss_mask", "advantages", "old_logprobs")}
    placements = []
    for i, d in enumerate(datums):
        if i not in where:
            placements.append((-1, -1, -1, 0))
            continue
        row, start, seg = where[i]
        n = lengths[i]
        sl = slice(start, start + n)
        tok = np.asarray(d.tokens, np.int32)
        m = np.asarray(d.mask[1:], np.float32)
        arr["tokens"][row, sl] = tok[:-1]
        arr["targets"][row, sl] = tok[1:]
        arr["positions"][row, sl] = np.arange(n)
        arr["segment_ids"][row, sl] = seg
        flt["loss_mask"][row, sl] = m
        if d.advantage is None:
            raise ValueError(f"datum {i} ({d.objective}, node {d.node_id!r}) has no advantage: no baseline ran")
        a = d.advantage * d.weight
        adv = a if advantage_clip is None else min(max(a, -advantage_clip), advantage_clip)
        flt["advantages"][row, sl] = m * np.float32(adv)
        flt["old_logprobs"][row, sl] = np.asarray(d.logprobs[1:], np.float32)
        placements.append((row // rows_per_micro, row % rows_per_micro, start, n))

    total = count_loss_tokens([d for i, d in enumerate(datums) if i in where]) if num_tokens is None \
        else int(num_tokens)
    micro = []
    for b in range(n_micro):
        rs = slice(b * rows_per_micro, (b + 1) * rows_per_micro)
        # Host arrays: the step's placement puts them on the devices in its layout in one transfer.
        micro.append(MicroBatch(**{k: np.ascontiguousarray(v[rs]) for k, v in {**arr, **flt}.items()},
                                num_tokens=np.asarray(total, np.int32)))
    return PackedStep(micro, placements, total)
