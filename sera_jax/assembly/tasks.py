"""The env tasks a config's run draws from (``env.task_set``, ``env.difficulties``)."""

from __future__ import annotations

from typing import Any

from sera_jax.agents.environments import environment
from sera_jax.config import RunConfig


def load_env_tasks(cfg: RunConfig) -> tuple[list[Any], list[str]]:
    """Returns (tasks filtered by ``env.difficulties``, the data files they came from)."""
    # The environment's loader: TextCraft's named sets, files or generated train split; TextWorld's files,
    # "sample", folds, "<fold>@<base seed>?…" sets generated from another seed range, or "+" unions.
    tasks, files = environment(cfg.env.name).get("load_tasks")(cfg.env.task_set)
    if cfg.env.difficulties:
        tasks = [t for t in tasks if t.difficulty in cfg.env.difficulties]
    if not tasks:
        raise ValueError(f"env.task_set {cfg.env.task_set!r} with difficulties {cfg.env.difficulties} has no task")
    return tasks, files
