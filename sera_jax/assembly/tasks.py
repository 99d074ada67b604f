"""The env tasks a config's run draws from (``env.task_set``, ``env.difficulties``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import envs_py.textcraft as textcraft_env
from envs_py.textworld_sync.task_sets import load_task_set
from sera_jax.config import RunConfig

GENERATED_TRAIN_TASKS = 4000


def load_env_tasks(cfg: RunConfig) -> tuple[list[Any], list[str]]:
    """Returns (tasks filtered by ``env.difficulties``, the data files they came from)."""
    if cfg.env.name == "textcraft":
        if cfg.env.task_set == "generated":
            # The generator's train split (train items only: disjoint from every val item), by the upstream rules.
            tasks, files = textcraft_env.generate_tasks("train", n_train=GENERATED_TRAIN_TASKS), []
        else:
            tasks = textcraft_env.load_tasks(cfg.env.task_set)
            files = [cfg.env.task_set] if Path(cfg.env.task_set).is_file() else []
    else:
        # A file, "sample", a fold, "<fold>@<base seed>?…" generated from another seed range, or a "+" union.
        tasks, files = load_task_set(cfg.env.task_set)
    if cfg.env.difficulties:
        tasks = [t for t in tasks if t.difficulty in cfg.env.difficulties]
    if not tasks:
        raise ValueError(f"env.task_set {cfg.env.task_set!r} with difficulties {cfg.env.difficulties} has no task")
    return tasks, files
