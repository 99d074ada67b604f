"""Judge labels of sub-agents, asked after their root rollout has finished (TextWorld; docs/design/recipes.md §1b, §3).

Two uses of a configured judge (``judge.py``: ``ChatJudge``, ``PolicyJudge``, or any object with
``async label(node, parent_goal) -> Label``), each behind a ``SubagentJudge`` that bounds the requests in flight:

* **Execution labels of the RAO family** (RAO, RAO+D, RAO+RT: ``execution_reward = "rao"``) on TextWorld.
  TextWorld's world check means "the whole shared task is solved", so it cannot grade a sub-task: after a root
  rollout ends, every non-root node is judged once (the judge prompt asks whether the sub-agent completed *its own*
  assigned goal for its immediate parent; reply a strict JSON boolean). ``label_subagents`` writes the label to
  ``node.reward.judge`` (1.0 / 0.0), which ``rl.rewards.execution_reward`` takes as the sub-agent's
  reward; the root keeps its programmatic world success and is never judged. One attempt, no retry (the reference's
  execution judge; ``max_attempts=1``). A failed call (transport error, timeout, invalid reply, an exception) marks
  that node ``skip_gradient_update``: its tokens leave training, the tree stays whole (root, siblings, descendants,
  parent links and depths). Each judged node records what its label cost in ``node.misc["execution_judge"]`` (the
  fields the branch judge records, see ``judge_record``) and each tree its totals in
  ``tree.misc["execution_judge_stats"]``; ``training.stats.tree_metrics`` sums them into the step's supervision
  metrics. A node that already has a label or a record is not judged again. TextCraft (programmatic crafted-delta
  + finish check) and the delegation stage use no judge.
* **Branch labels of the rubric-generation stage** (TextWorld). The reference asks its RT judge only about the
  branches of fork groups that are complete and whose fresh rubric is valid (concurrently with their scoring;
  ``rubric_generation_ranking_textworld/stage.py``). The counterfactual collector labels branches while they run,
  so on TextWorld it is given ``DeferredJudge()`` (no request, no label), and after ``factory.finalize`` has written
  the rubrics and scores, ``label_fork_groups`` labels exactly those groups' branches: ``Branch.success`` (None when
  the judge failed: the branch is left out of the ranking) and the node's ``misc["judge_label"]`` record (what the
  collector writes), with the judge's own retries (3 attempts for the RT judge).

Concurrency: the reference keeps 16 judge requests in flight per rank, shared by all the rank's trees; build one
``SubagentJudge`` per use and share it across task groups. Every request is a ``judge`` span of the active trace
(``ChatJudge``) or a policy call (``PolicyJudge``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from sera_jax.agents.judge import Label, with_attempts
from sera_jax.agents.records import Node, Tree, TreeIndex

__all__ = ["SPENT_KEY", "STATS_KEY", "BRANCH_KEY", "BRANCH_STATS_KEY", "DeferredJudge",
           "SubagentJudge", "judge_record", "label_subagents", "label_fork_groups"]

SPENT_KEY = "execution_judge"                # node.misc: the execution label's record (judge_record)
STATS_KEY = "execution_judge_stats"          # tree.misc: the execution judge's totals over the tree
BRANCH_KEY = "judge_label"                   # node.misc of a branch: its label's record (as the collector writes it)
BRANCH_STATS_KEY = "branch_judge_stats"      # tree.misc: the deferred branch labels' totals over the tree
EXECUTION_CONCURRENCY = 16                   # docs/design/recipes.md §1b: judge requests in flight per rank
DEFERRED_REASON = "deferred: labelled after the fork group's rubric is written (label_fork_groups)"


def judge_record(label: Label, backend: str | None = None) -> dict[str, Any]:
    """Returns the record a label leaves on its node: success (None = no label), reason, error, and its spend —
    requests (``calls``), prompt and completion tokens, requests without a token count (``unmetered_calls``) — and
    the backend that answered (``endpoint`` | ``frozen`` | ``policy``) when known."""
    return {"success": label.success, "reason": label.reason, "error": label.error, "calls": label.attempts,
            "prompt_tokens": label.prompt_tokens, "completion_tokens": label.completion_tokens,
            "unmetered_calls": label.unmetered, **({"backend": backend} if backend else {})}


def _totals() -> dict[str, int]:
    return {"candidates": 0, "labelled": 0, "failed": 0, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "unmetered_calls": 0}


def _add(totals: dict[str, int], rec: dict[str, Any]) -> None:
    totals["candidates"] += 1
    totals["labelled" if rec["success"] is not None else "failed"] += 1
    for k in ("calls", "prompt_tokens", "completion_tokens", "unmetered_calls"):
        totals[k] += int(rec[k])


class DeferredJudge:
    """The TextWorld rubric-generation stage's judge *while branches run*: it sends nothing and labels nothing, so
    that ``label_fork_groups`` labels only the groups whose rubric turned out valid."""

    async def label(self, node: Node, parent_goal: str = "") -> Label:
        """Returns an empty label (no request made)."""
        return Label(None, DEFERRED_REASON)


class SubagentJudge:
    """A judge with at most ``concurrency`` labels in flight (shared by every call on this object) and, when
    ``max_attempts`` is given, that many requests per label (``judge.with_attempts``)."""

    def __init__(self, judge: Any, *, concurrency: int = EXECUTION_CONCURRENCY, max_attempts: int | None = None):
        if concurrency < 1:
            raise ValueError("concurrency must be ≥ 1")
        self.judge = judge if max_attempts is None else with_attempts(judge, max_attempts)
        self.concurrency = int(concurrency)
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        # One semaphore per event loop (a semaphore is bound to the loop it first waited in).
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.concurrency))
        return self._gate[1]

    async def label(self, node: Node, parent_goal: str) -> Label:
        """Returns the judge's label of one finished sub-agent; an exception of the judge is a failed label."""
        async with self._semaphore():
            try:
                return await self.judge.label(node, parent_goal)
            except Exception as e:  # noqa: BLE001  (a judge failure labels nothing; it must not fail the group)
                return Label(None, "", 0, f"judge raised {type(e).__name__}: {e}")

    # -- execution labels (RAO family, TextWorld) -------------------------------------------------------------
    async def label_subagents(self, trees: Sequence[Tree]) -> dict[str, int]:
        """Judges every non-root node of ``trees`` not judged before, once; writes ``node.reward.judge``
        or, on failure, ``skip_gradient_update``; returns the totals over these trees (also per tree in
        ``tree.misc["execution_judge_stats"]``)."""
        jobs: list[tuple[Tree, Node, str]] = []
        for tree in trees:
            idx = TreeIndex.build(tree)
            for nid in sorted(tree.nodes, key=lambda i: (idx.depth[i], i)):
                node, parent = tree.nodes[nid], idx.parent[nid]
                if parent is None or node.reward.judge is not None or SPENT_KEY in node.misc:
                    continue
                jobs.append((tree, node, tree.nodes[parent].goal))
        labels = await asyncio.gather(*(self.label(node, goal) for _, node, goal in jobs))
        per_tree: dict[str, dict[str, int]] = {t.id: _totals() for t in trees}
        for (tree, node, _), label in zip(jobs, labels):
            rec = judge_record(label, getattr(self.judge, "backend", None))
            node.misc[SPENT_KEY] = rec
            if label.success is None:
                node.skip_gradient_update = True  # this sub-agent's tokens leave training; the tree stays
            else:
                node.reward = dataclasses.replace(node.reward, judge=1.0 if label.success else 0.0)
            _add(per_tree[tree.id], rec)
        total = _totals()
        for tree in trees:
            stats = tree.misc.setdefault(STATS_KEY, _totals())
            for k, v in per_tree[tree.id].items():
                stats[k] = stats.get(k, 0) + v
                total[k] += v
        return total

    # -- branch labels of the rubric-generation stage (TextWorld) ---------------------------------------------
    async def label_fork_groups(self, trees: Sequence[Tree]) -> dict[str, int]:
        """Labels the branches of every complete fork group with a valid rubric that have no label and no judge
        request yet; writes ``Branch.success`` and the branch node's ``misc["judge_label"]``; returns the totals
        (also per tree in ``tree.misc["branch_judge_stats"]``, with ``groups`` = the groups labelled)."""
        jobs = []
        groups: dict[str, int] = {t.id: 0 for t in trees}
        for tree in trees:
            for g in tree.fork_groups:
                if not g.complete or g.rubric is None:
                    continue
                todo = [b for b in g.branches if b.success is None and b.trajectory_id in tree.nodes
                        and not int((tree.nodes[b.trajectory_id].misc.get(BRANCH_KEY) or {}).get("calls", 0) or 0)]
                groups[tree.id] += int(bool(todo))
                parent_goal = tree.nodes[g.parent_id].goal if g.parent_id in tree.nodes else ""
                jobs.extend((tree, b, tree.nodes[b.trajectory_id], parent_goal) for b in todo)
        labels = await asyncio.gather(*(self.label(node, goal) for _, _, node, goal in jobs))
        per_tree: dict[str, dict[str, int]] = {t.id: _totals() for t in trees}
        for (tree, branch, node, _), label in zip(jobs, labels):
            rec = judge_record(label, getattr(self.judge, "backend", None))
            node.misc[BRANCH_KEY] = rec
            branch.success = label.success
            _add(per_tree[tree.id], rec)
        total = {"groups": 0, **_totals()}
        for tree in trees:
            stats = tree.misc.setdefault(BRANCH_STATS_KEY, {"groups": 0, **_totals()})
            for k, v in {"groups": groups[tree.id], **per_tree[tree.id]}.items():
                stats[k] = stats.get(k, 0) + v
                total[k] += v
        return total


async def label_subagents(trees: Sequence[Tree], judge: Any, *, concurrency: int = EXECUTION_CONCURRENCY,
                          max_attempts: int | None = 1) -> dict[str, int]:
    """Returns the totals of ``SubagentJudge(judge, concurrency=…, max_attempts=…).label_subagents(trees)``:
    execution labels of the RAO family with one attempt each (see the module docstring). A long-lived caller
    should keep one ``SubagentJudge`` so that its concurrency bound is shared across task groups."""
    return await SubagentJudge(judge, concurrency=concurrency, max_attempts=max_attempts).label_subagents(trees)


async def label_fork_groups(trees: Sequence[Tree], judge: Any, *, concurrency: int = EXECUTION_CONCURRENCY,
                            ) -> dict[str, int]:
    """Returns the totals of ``SubagentJudge(judge, concurrency=…).label_fork_groups(trees)``: the deferred
    branch labels of the valid fork groups, with the judge's own attempts."""
    return await SubagentJudge(judge, concurrency=concurrency).label_fork_groups(trees)
