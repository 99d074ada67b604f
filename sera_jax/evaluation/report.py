"""Evaluation arithmetic: per-difficulty and task-weighted overall success, mean ± sample std over runs.

The protocol (docs/design/algorithm.md §9, docs/design/textworld.md §12): one greedy tree per task; a rollout that raises is retried once and then
counted as a failure; success rate = successful / scheduled per difficulty; the overall rate is weighted by task
count, not the mean of the difficulty rates. Repeated runs are reported as mean ± *sample* standard deviation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence


def aggregate(rates: Sequence[float], counts: Sequence[int]) -> float:
    """Returns the overall rate of several groups: Σ rate·count / Σ count (rates in any unit, e.g. percent)."""
    if len(rates) != len(counts):
        raise ValueError(f"{len(rates)} rates but {len(counts)} counts")
    total = sum(counts)
    if total <= 0 or any(c < 0 for c in counts):
        raise ValueError(f"counts must be non-negative with a positive sum, got {list(counts)}")
    return sum(r * c for r, c in zip(rates, counts)) / total


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Returns (mean, sample standard deviation); the std of a single run is 0."""
    if not values:
        raise ValueError("mean_std of no values")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One scheduled task's result: ``success`` None means the rollout errored (after its retry)."""

    task_id: str
    difficulty: str
    success: bool | None


def summarise(outcomes: Iterable[Outcome], difficulty_order: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    """Returns {difficulty: {scheduled, successful, errored, rate}} plus "overall" (task-weighted), rates in %."""
    buckets: dict[str, list[Outcome]] = {}
    for o in outcomes:
        buckets.setdefault(o.difficulty, []).append(o)
    order = [d for d in difficulty_order if d in buckets] + sorted(d for d in buckets if d not in difficulty_order)
    table: dict[str, dict[str, float]] = {}
    for d in order:
        group = buckets[d]
        ok = sum(1 for o in group if o.success)
        table[d] = {"scheduled": len(group), "successful": ok,
                    "errored": sum(1 for o in group if o.success is None), "rate": 100.0 * ok / len(group)}
    if table:
        table["overall"] = {
            "scheduled": sum(r["scheduled"] for r in table.values()),
            "successful": sum(r["successful"] for r in table.values()),
            "errored": sum(r["errored"] for r in table.values()),
            "rate": aggregate([r["rate"] for r in table.values()], [r["scheduled"] for r in table.values()]),
        }
    return table


def markdown_table(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> str:
    """Returns a Markdown table of per-difficulty rates over runs as mean ± sample std."""
    if not runs:
        return ""
    columns = list(runs[0])
    head = "| | " + " | ".join(f"{c} ({int(runs[0][c]['scheduled'])})" for c in columns) + " |"
    sep = "|---|" + "---|" * len(columns)
    cells = []
    for c in columns:
        m, s = mean_std([r[c]["rate"] for r in runs])
        cells.append(f"{m:.2f} ± {s:.2f}" if len(runs) > 1 else f"{m:.2f}")
    return "\n".join([head, sep, f"| success % ({len(runs)} run{'s' if len(runs) > 1 else ''}) | "
                      + " | ".join(cells) + " |"])


# ---------------------------------------------------------------------------------------------------------------
# Reading trees, picking tasks, the report

DIFFICULTY_ORDER = ("easy", "medium", "hard", "extreme")


def tree_error(tree) -> str | None:
    """Returns why a tree record counts as a failed rollout (the tree or its root agent ended with an error), or
    None. A sub-agent's crash is not a rollout error: its parent was told and carried on."""
    if tree.misc.get("error"):
        return str(tree.misc["error"])
    root = tree.nodes.get(tree.root_id)
    if root is None:
        return "no root node"
    if root.rollout_error_zero_reward:
        return (root.error_message or root.misc.get("label_error") or "root agent error").split("\n", 1)[0]
    return None


def tree_success(tree) -> bool:
    """Returns whether the root agent succeeded (programmatic label ≥ 1.0, docs/design/algorithm.md §9) in a tree without error."""
    root = tree.nodes.get(tree.root_id)
    return (tree_error(tree) is None and root is not None
            and float(root.env_labels.get("success", 0.0) or 0.0) >= 1.0)


def pick_tasks(tasks: Sequence, n: int | None) -> list:
    """Returns the first ``n`` tasks taken round-robin over difficulties (in DIFFICULTY_ORDER, each difficulty in
    file order), so a small sample still covers every difficulty; all tasks (file order) when ``n`` is None."""
    tasks = list(tasks)
    if n is None or n >= len(tasks):
        return tasks
    by: dict[str, list] = {}
    for t in tasks:
        by.setdefault(str(t.difficulty), []).append(t)
    order = [d for d in DIFFICULTY_ORDER if d in by] + sorted(d for d in by if d not in DIFFICULTY_ORDER)
    out: list = []
    depth = 0
    while len(out) < n:
        for d in order:
            if depth < len(by[d]) and len(out) < n:
                out.append(by[d][depth])
        depth += 1
    return out


def report(runs: Sequence[Mapping[str, Mapping[str, float]]], **meta) -> dict:
    """Returns the evaluation report: ``meta`` plus ``runs`` (one summarise() table per run), ``mean_std``
    ({bucket: [mean, sample std] of the rate over runs}) and ``markdown`` (markdown_table of the runs)."""
    if not runs:
        raise ValueError("report of no runs")
    stats = {b: list(mean_std([r[b]["rate"] for r in runs])) for b in runs[0]}
    return {**meta, "num_runs": len(runs), "runs": [dict(r) for r in runs], "mean_std": stats,
            "overall_rate_mean": stats["overall"][0], "overall_rate_std": stats["overall"][1],
            "markdown": markdown_table(runs)}
