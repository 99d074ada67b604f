"""A step's trainable datums → the stacked micro-batches ``train_step`` takes: the skip rule, depth weighting, packing
(advantage × weight clipped to ±``advantage_clip``, the config's ``batch.advantage_clip``) and the micro-batch count
M (``rl.shapes``), for one process holding the whole step (``build_batch``) or one process of a multi-host step
holding its share (``build_shared_batch``: shape and weights from the step's gathered figures)."""

from __future__ import annotations

from typing import Callable, Sequence

from sera_jax.rl.baselines import GroupCredit, apply_depth_weights, step_is_skipped
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.shapes import bucket_length, micro_batch_count
from sera_jax.rl.stages import MethodConfig
from sera_jax.training.shared_step import SharedStep
from sera_jax.training.step import stack_micro_batches


def build_batch(groups: Sequence[GroupCredit], method: MethodConfig, *, min_trainable: int, token_budget: int,
                buckets: Sequence[int], row_multiple: int, warmed_micro_batches: Sequence[int] = (),
                advantage_clip: float | None = 20.0):
    """Returns (stacked micro-batches or None, info): depth-weighted trainable datums packed for ``train_step``,
    their count padded by ``micro_batch_count``; None when the step must be skipped (fewer than ``min_trainable``
    trainable datums: the reference's 8 ranks, docs/design/recipes.md §2.7)."""
    datums = [d for g in groups for d in g.datums]
    trainable = [d for d in datums if d.trainable]
    info = {"datums": len(datums), "trainable_datums": len(trainable)}
    if step_is_skipped(len(trainable), min_trainable):
        return None, {**info, "reason": f"{len(trainable)} trainable datums < {min_trainable} (one per rank)"}
    if method.depth_level_weighting:
        trainable = apply_depth_weights(trainable, gamma=method.depth_level_discount_gamma)
    packed = pack_datums(trainable, token_budget=token_budget, buckets=buckets, row_groups=row_multiple,
                         advantage_clip=advantage_clip)
    batch = stack_micro_batches(packed.micro_batches, row_multiple=row_multiple,
                                num=micro_batch_count(len(packed.micro_batches), warmed_micro_batches))
    info.update(micro_batches=len(packed.micro_batches), loss_tokens=packed.num_tokens,
                rows=int(batch.tokens.shape[1]), row_len=int(batch.tokens.shape[2]))
    return batch, info


def build_shared_batch(groups: Sequence[GroupCredit], shared: SharedStep, method: MethodConfig, *,
                       min_trainable: int, token_budget: int, buckets: Sequence[int], row_multiple: int,
                       warmed_micro_batches: Sequence[int], agree: Callable[[int], int],
                       advantage_clip: float | None = 20.0):
    """Returns (this process's rows of the stacked micro-batches or None, info) for a multi-host step.

    The skip rule, the depth weights, the row length T and the loss-token count come from the whole step's
    gathered figures, so every process packs its own datums into micro-batches of the same [rows / P, T] and the
    CISPO token mean divides by the step's tokens; ``agree(n)`` returns the largest local micro-batch count (a
    gather), padded like ``build_batch``'s. The global batch is the processes' rows side by side."""
    info = {"datums": sum(f["datums"] for f in shared.figures), "trainable_datums": shared.trainable}
    if step_is_skipped(shared.trainable, min_trainable):
        return None, {**info, "reason": f"{shared.trainable} trainable datums < {min_trainable} (one per rank)"}
    processes = len(shared.figures)
    if row_multiple % processes:
        raise ValueError(f"the batch split ({row_multiple} devices) is not a multiple of the {processes} processes")
    local_rows = row_multiple // processes
    trainable = [d for g in groups for d in g.datums if d.trainable]
    if method.depth_level_weighting:
        trainable = apply_depth_weights(trainable, gamma=method.depth_level_discount_gamma,
                                        histogram=shared.depth_histogram())
    row_len = bucket_length(max(shared.max_len, 1), buckets)
    packed = pack_datums(trainable, token_budget=token_budget, buckets=buckets, row_len=row_len,
                         num_tokens=shared.loss_tokens, row_groups=local_rows, advantage_clip=advantage_clip)
    num = micro_batch_count(agree(len(packed.micro_batches)), warmed_micro_batches)
    batch = stack_micro_batches(packed.micro_batches, row_multiple=local_rows, num=num)
    info.update(micro_batches=num, loss_tokens=shared.loss_tokens, rows=int(batch.tokens.shape[1]) * processes,
                row_len=int(batch.tokens.shape[2]))
    return batch, info
