"""Evaluation arithmetic: per-difficulty and task-weighted overall success, mean ± sample std over runs.

The protocol (spec §9, TextWorld §12): one greedy tree per task; a rollout that raises is retried once and then
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
