"""TextCraft-Synth task rows: the official validation (632) and Medium training (852) sets, and task files.

A task is an :class:`envs_py.core.Task` whose ``payload`` holds the row's ``target_items``,
``initial_inventory``, ``gold_trajectory``, ``max_depth``, ``num_craft_steps``, ``required_base``,
``recipes_needed`` and ``world`` (the recipe world's seed and size). The row's stored ``max_steps`` (75,
the upstream default) is kept as ``payload["stored_max_steps"]`` for reference only: the per-agent step
budget is a runtime setting (``DEFAULT_MAX_STEPS`` = 20, SERA's value), never read from the row.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from importlib import resources
from typing import Iterable, Mapping

from envs_py.core import Task

DEFAULT_MAX_STEPS = 20
OFFICIAL_FILES = {"val": "val_632.jsonl.gz", "train": "train_medium_852.jsonl.gz"}
DIFFICULTIES = ("easy", "medium", "hard", "extreme")


def goal_text(targets: Mapping[str, int]) -> str:
    """Returns the goal string ``Craft the following items: 2x a, 1x b`` (dict order)."""
    return "Craft the following items: " + ", ".join(f"{n}x {item}" for item, n in targets.items())


def task_from_row(row: Mapping) -> Task:
    """Returns the Task of one task-file row (flat layout, or the upstream ``{id, goal, misc}`` layout)."""
    misc = row.get("misc")
    if isinstance(misc, Mapping):  # upstream record layout
        row = {**misc, "task_id": row.get("id"), "goal": row.get("goal"), "max_steps": row.get("max_steps")}
    targets = {str(k): int(v) for k, v in row["target_items"].items()}
    payload = {
        "target_items": targets,
        "initial_inventory": {str(k): int(v) for k, v in row["initial_inventory"].items()},
        "gold_trajectory": list(row.get("gold_trajectory") or []),
        "max_depth": int(row.get("max_depth", 0)),
        "num_craft_steps": int(row.get("num_craft_steps", 0)),
        "required_base": dict(row.get("required_base") or {}),
        "recipes_needed": dict(row.get("recipes_needed") or {}),
        "world": dict(row.get("world") or {"seed": 42, "items_per_domain_tier": 25}),
        "stored_max_steps": row.get("max_steps"),
    }
    return Task(task_id=str(row["task_id"]), difficulty=str(row["difficulty"]),
                goal=str(row.get("goal") or goal_text(targets)), payload=payload)


def task_to_row(task: Task) -> dict:
    """Returns the flat JSON row of a task (the inverse of :func:`task_from_row`)."""
    p = dict(task.payload)
    stored = p.pop("stored_max_steps", None)
    return {"task_id": task.task_id, "difficulty": task.difficulty, "goal": task.goal,
            "max_steps": 75 if stored is None else stored, **p}


def _read_rows(lines: Iterable[str]) -> list[Task]:
    return [task_from_row(json.loads(line)) for line in lines if line.strip()]


def load_tasks(which: str | os.PathLike = "val") -> list[Task]:
    """Returns the tasks of ``"val"`` (632, official ids), ``"train"`` (852 Medium) or a ``.jsonl[.gz]``/``.json`` path.

    Each task has ``.task_id``, ``.difficulty``, ``.goal`` and the payload described in the module docstring.
    """
    if isinstance(which, str) and which in OFFICIAL_FILES:
        raw = resources.files("envs_py.textcraft").joinpath("data").joinpath(OFFICIAL_FILES[which]).read_bytes()
        return _read_rows(io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="utf-8"))
    path = os.fspath(which)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no task set named {which!r} (use 'val', 'train' or a path)")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        if path.endswith(".json") or path.endswith(".json.gz"):
            data = json.load(fh)
            rows = data.get("tasks", data) if isinstance(data, dict) else data
            return [task_from_row(r) for r in rows]
        return _read_rows(fh)


def save_tasks(tasks: Iterable[Task], path: str | os.PathLike) -> None:
    """Writes tasks as JSONL (gzip when the path ends with .gz); returns nothing."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for t in tasks:
            fh.write(json.dumps(task_to_row(t)) + "\n")
