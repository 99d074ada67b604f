"""Rollout admission (docs/design/recipes.md §2): which task groups a step trains on, and how stale they may be.

The reference runs one rollout executor per trainer rank (8). A rank draws tasks from its own data shard, runs task
groups within a quota, and hands the trainer B = 1 *accepted* group per update; a rejected group (its stage's filter
says ``None``) frees its quota and the rank starts the next task. Every accepted group is trained. The quota of a
rank at policy version v, with ``ofp = max_head_offpolicyness`` and C its share of ``max_concurrent_rollouts``::

    start another group while  running < C  and  running + accepted-not-yet-trained < ofp + 1 − delivered

where ``delivered`` is 1 once the rank has handed over its group for version v (the reference's
``(ofp + v + 1)·B − (accepted + running)`` with every earlier update having consumed one group per rank). So:

* ofp = 0 (every multi-stage recipe, every TextWorld recipe): one group in flight per rank, replacements one after
  another, nothing runs across an update; each trained group was sampled entirely by the version it trains.
* ofp = 3 with C = 1 (TextCraft RAO and SERA w/o D & RT): when a rank delivers, its next group starts at once and
  keeps generating while the trainer updates (it is trained at least one version later; CISPO's old policy is the
  sampler's logprobs). While another rank waits on a slow group, a rank whose groups finish fast may bank up to
  ofp accepted groups, so a group can be up to ofp versions stale, as in the reference. The bound
  ``version − start_version ≤ ofp`` is checked again when a group is consumed.

Two choices of ours, both without effect on the paper recipes:

* A rank consumes its groups in the order they *started* (the reference: completion order; the two differ only
  when a rank runs several groups at once, which no paper recipe does). Completion order would favour short,
  non-delegating trees whenever groups overlap.
* ``speculative`` extra groups per rank (the tiny CPU default: 1) may run beyond the quota, to keep a small engine
  busy. They are consumed strictly in start order like the rest, so they change *when* a group runs, not *which*
  groups are trained; one not needed by the end of the step (or too stale for the next) is cancelled and its task
  handed back to the rank's stream, to be drawn first.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Sequence

from sera_jax.rl.baselines import GroupCredit
from sera_jax.training.task_stream import TaskStream

RunGroup = Callable[[Any, str, int], Any]           # async (task, stage, version) → trees
Credit = Callable[[str, list], GroupCredit]          # (stage, trees) → credit and verdict


@dataclasses.dataclass
class Entry:
    """One started task group of a rank."""

    task_index: int
    start_version: int
    stage: str
    speculative: bool
    future: asyncio.Future
    trees: list | None = None
    credit: GroupCredit | None = None

    @property
    def finished(self) -> bool:
        return self.future.done()

    @property
    def rejected(self) -> bool:
        return self.credit is not None and not self.credit.accepted


@dataclasses.dataclass(frozen=True)
class AdmittedGroup:
    """A group handed to the trainer: its credit, the rank that ran it and the version that started it."""

    credit: GroupCredit
    rank: int
    task_index: int
    start_version: int


class Admission:
    """Runs task groups per rank under the §2 quota and hands each step one accepted group per rank.

    ``collect(stage, version, ranks)`` returns the step's groups (fewer than ``ranks`` when the attempt bound ran
    out) and statistics; ``close()`` cancels what is still running and requeues its tasks (call it before a final
    checkpoint). Groups still running after ``collect`` returns are those the staleness bound lets continue through
    the update (ofp ≥ 1); all others are cancelled there.
    """

    def __init__(self, run_group: RunGroup, credit: Credit, tasks: Sequence[Any], stream: TaskStream, *,
                 concurrency: int = 1, max_offpolicyness: int = 0, speculative: int = 0) -> None:
        if concurrency < 1 or max_offpolicyness < 0 or speculative < 0:
            raise ValueError("need concurrency ≥ 1, max_offpolicyness ≥ 0 and speculative ≥ 0")
        self.run_group, self.credit, self.tasks, self.stream = run_group, credit, tasks, stream
        self.concurrency, self.ofp, self.speculative = concurrency, max_offpolicyness, speculative
        self.queues: dict[int, list[Entry]] = {}

    # ------------------------------------------------------------------------------------------------ quota

    def _quota(self, queue: list[Entry], delivered: bool) -> tuple[int, int]:
        """Returns (regular, speculative) groups the rank may still start."""
        live = [e for e in queue if not e.rejected]
        running = sum(not e.finished for e in live)
        held = len(live)  # running + finished-and-accepted, not yet consumed
        limit = self.ofp + 1 - int(delivered)
        regular = max(0, min(self.concurrency - running, limit - held))
        extra = max(0, min(self.concurrency + self.speculative - running, limit + self.speculative - held) - regular)
        return regular, extra

    def _start(self, rank: int, stage: str, version: int, delivered: bool, stats: dict) -> None:
        queue = self.queues.setdefault(rank, [])
        for e in queue:  # a finished group's verdict frees its quota at once when it was rejected
            if e.finished:
                self._settle(e, stats)
        regular, extra = self._quota(queue, delivered)
        for i in range(regular + extra):
            idx = self.stream.next(rank)
            stats["groups_started"] += 1
            stats["groups_speculative"] += int(i >= regular)
            queue.append(Entry(idx, version, stage, i >= regular,
                               asyncio.ensure_future(self._run(idx, stage, version))))

    async def _run(self, idx: int, stage: str, version: int) -> tuple[list, GroupCredit]:
        trees = await self.run_group(self.tasks[idx], stage, version)
        return trees, self.credit(stage, trees)

    # ------------------------------------------------------------------------------------------------ a step

    async def collect(self, stage: str, version: int, ranks: int | Sequence[int], *, max_attempts: int
                      ) -> tuple[list[AdmittedGroup], dict[str, Any]]:
        """Returns one accepted group per rank (rank order) for the step at ``version`` and statistics.

        ``ranks`` is the rank count (ranks 0..ranks-1) or, in a multi-host step, the ranks this process runs
        (``parallel.hosts.deal_ranks``): each rank draws from its own data shard, so the union of the processes'
        groups is what one process running every rank would collect.

        ``stats["tree_records"]`` holds every finished group's trees (rejected ones included) for the records;
        at most ``max_attempts`` groups are started by this call (a bound on replacements for a policy that never
        passes the filter).
        """
        stats: dict[str, Any] = {"groups_started": 0, "groups_rejected": 0, "groups_speculative": 0,
                                 "groups_cancelled": 0, "groups_carried": 0, "groups_stale_dropped": 0,
                                 "trees": 0, "tree_records": []}
        for e in (e for q in self.queues.values() for e in q):
            if e.stage != stage and not e.finished:
                raise RuntimeError(f"a {e.stage} group is still running at a {stage} step: staleness across "
                                   "stages needs max_head_offpolicyness = 0 (multi-stage schedules require it)")
        got: dict[int, AdmittedGroup] = {}
        rank_ids = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        while len(got) < len(rank_ids):
            for r in rank_ids:
                if r not in got and stats["groups_started"] < max_attempts:
                    self._start(r, stage, version, False, stats)
            for r in rank_ids:
                if r not in got:
                    self._take(r, version, stats, got)
            waiting = [r for r in rank_ids if r not in got]
            if not waiting:
                break
            heads = [self.queues[r][0].future for r in waiting if self.queues.get(r)]
            if not heads:
                break  # the attempt bound ran out with nothing left running
            await asyncio.wait(heads, return_when=asyncio.FIRST_COMPLETED)
        # The poll that collects a rank's group starts its next one when the bound lets it run across the update.
        for r in rank_ids:
            if r in got and stats["groups_started"] < max_attempts:
                self._start(r, stage, version, True, stats)
        await self._retire(version + 1, stats)
        groups = [got[r] for r in sorted(got)]
        stats["groups_carried"] = sum(not e.finished for q in self.queues.values() for e in q)
        stats["group_lag_max"] = max((version - g.start_version for g in groups), default=0)
        return groups, stats

    def _take(self, rank: int, version: int, stats: dict, got: dict[int, AdmittedGroup]) -> None:
        """Consumes the rank's finished head entries in start order until one is accepted or the head runs."""
        queue = self.queues.get(rank, [])
        while queue and queue[0].finished:
            e = queue.pop(0)
            self._settle(e, stats)
            if e.rejected:
                stats["groups_rejected"] += 1
                continue
            if version - e.start_version > self.ofp:  # never with the quota alone; a guard for speculative ones
                stats["groups_stale_dropped"] += 1
                continue
            got[rank] = AdmittedGroup(e.credit, rank, e.task_index, e.start_version)
            return

    def _settle(self, e: Entry, stats: dict) -> None:
        if e.credit is None:
            e.trees, e.credit = e.future.result()
            stats["trees"] += len(e.trees)
            stats["tree_records"].extend(e.trees)

    async def _retire(self, next_version: int, stats: dict) -> None:
        """Cancels the groups the next version may not train (too stale, or speculative beyond its quota) and hands
        their tasks back to the stream; finished groups of the next version's quota are kept."""
        cancelled = []
        for r, queue in self.queues.items():
            keep, drop = [], []
            for e in queue:
                (keep if next_version - e.start_version <= self.ofp and not e.speculative else drop).append(e)
            for e in drop:
                if e.finished and e.credit is None and not e.future.cancelled() and e.future.exception() is None:
                    self._settle(e, stats)  # a finished group's trees still go to the records
                e.future.cancel()
                cancelled.append(e.future)
            stats["groups_cancelled"] += sum(not e.finished for e in drop)
            self.stream.requeue(r, [e.task_index for e in drop])
            self.queues[r] = keep
        if cancelled:  # cancelling frees the engine blocks of their pending turns
            await asyncio.gather(*cancelled, return_exceptions=True)

    def pending(self) -> dict[int, list[int]]:
        """Returns each rank's started, untrained task indices in start order (a checkpoint requeues them)."""
        return {r: [e.task_index for e in q] for r, q in self.queues.items() if q}

    async def close(self) -> None:
        """Cancels every running group and hands its task back to the stream (before a final checkpoint)."""
        futures = []
        for r, queue in self.queues.items():
            for e in queue:
                e.future.cancel()
                futures.append(e.future)
            self.stream.requeue(r, [e.task_index for e in queue])
        self.queues = {}
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)
