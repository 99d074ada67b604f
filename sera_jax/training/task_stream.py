"""The training task order: one shard of a seeded permutation per admission rank, each consumed by its own cursor.

The reference gives each of its 8 trainer ranks a ``DistributedSampler`` shard (rank r takes items r, r + 8, … of a
shuffled order, dropping the ragged tail) and never calls ``set_epoch``, so every pass repeats the same order
(docs/design/recipes.md §1c). ``TaskStream`` does the same with numpy's permutation (torch's is not reproduced: the same seed
gives another order), per rank, with an option to reshuffle each pass instead (``train.reshuffle_each_epoch``).

Tasks a rank drew but never trained (a group cancelled at exit, a speculative group cancelled at the end of a step)
are handed back with ``requeue`` and drawn again first, so the data order a run trains on does not depend on how its
rollouts were scheduled. Everything is JSON (checkpointed with the run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from sera_jax.parallel.hosts import deal_ranks


@dataclasses.dataclass
class TaskStream:
    """Task indices per rank: ``next(rank)`` draws from the rank's shard, passes (epochs) restart the shard."""

    num_tasks: int
    seed: int
    ranks: int = 1
    reshuffle: bool = True                                   # a new permutation each pass (False: the reference)
    epochs: list[int] = dataclasses.field(default_factory=list)
    cursors: list[int] = dataclasses.field(default_factory=list)
    requeued: list[list[int]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_tasks <= 0:
            raise ValueError("the task set is empty")
        if self.ranks <= 0:
            raise ValueError(f"ranks must be positive, got {self.ranks}")
        self.epochs = list(self.epochs) or [0] * self.ranks
        self.cursors = list(self.cursors) or [0] * self.ranks
        self.requeued = [list(q) for q in self.requeued] or [[] for _ in range(self.ranks)]
        if not len(self.epochs) == len(self.cursors) == len(self.requeued) == self.ranks:
            raise ValueError("epochs, cursors and requeued need one entry per rank")

    def permutation(self, epoch: int) -> list[int]:
        """Returns the whole task order of one pass."""
        return np.random.default_rng([self.seed, epoch if self.reshuffle else 0]).permutation(self.num_tasks).tolist()

    def shard(self, rank: int, epoch: int) -> list[int]:
        """Returns rank ``rank``'s items of one pass: r, r + ranks, … of the permutation, each rank the same count
        (the ragged tail is dropped, as with ``drop_last``); with fewer tasks than ranks, rank r gets item r mod N."""
        perm = self.permutation(epoch)
        per_rank = self.num_tasks // self.ranks
        return perm[rank::self.ranks][:per_rank] if per_rank else [perm[rank % self.num_tasks]]

    def next(self, rank: int = 0) -> int:
        """Returns rank ``rank``'s next task index (a requeued one first), starting the next pass when the shard is
        used up. Ranks beyond the stream's own count (a checkpoint made with fewer) share shards modulo."""
        r = rank % self.ranks
        if self.requeued[r]:
            return self.requeued[r].pop(0)
        shard = self.shard(r, self.epochs[r])
        if self.cursors[r] >= len(shard):
            self.epochs[r] += 1
            self.cursors[r] = 0
            shard = self.shard(r, self.epochs[r])
        idx = shard[self.cursors[r]]
        self.cursors[r] += 1
        return idx

    def requeue(self, rank: int, indices: list[int]) -> None:
        """Hands drawn but untrained tasks back to rank ``rank``: they are drawn again first, in the given order."""
        r = rank % self.ranks
        self.requeued[r] = list(indices) + self.requeued[r]

    def to_json(self) -> dict[str, Any]:
        return {"num_tasks": self.num_tasks, "seed": self.seed, "ranks": self.ranks, "reshuffle": self.reshuffle,
                "epochs": list(self.epochs), "cursors": list(self.cursors),
                "requeued": [list(q) for q in self.requeued]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TaskStream":
        """Reads ``to_json``'s record, or the single-cursor record of checkpoints made before ranks existed."""
        if "cursor" in d:  # one shared stream: continue it as one rank
            return cls(d["num_tasks"], d["seed"], 1, True, [d["epoch"]], [d["cursor"]], [[]])
        return cls(**d)


def merge_streams(records: Sequence[dict[str, Any]], ranks: int) -> dict[str, Any]:
    """Returns the job's data-order record from every process's (process order): each rank's epoch, cursor and
    requeued tasks come from the process that runs it (``parallel.hosts.deal_ranks``); the other processes never
    moved that rank's cursor."""
    out = {**records[0], "epochs": list(records[0]["epochs"]), "cursors": list(records[0]["cursors"]),
           "requeued": [list(q) for q in records[0]["requeued"]]}
    if out["ranks"] != ranks:
        raise ValueError(f"the data order has {out['ranks']} ranks, the step {ranks}: a multi-host run needs them "
                         "equal")
    for p, rec in enumerate(records):
        for r in deal_ranks(ranks, p, len(records)):
            out["epochs"][r], out["cursors"][r] = rec["epochs"][r], rec["cursors"][r]
            out["requeued"][r] = list(rec["requeued"][r])
    return out
