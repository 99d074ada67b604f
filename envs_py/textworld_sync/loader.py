"""Loading TextWorld-Sync tasks from the official files, and writing manifests (docs/design/textworld.md §2).

Three forms are read: the manifest JSON (an object with a `tasks` list), manifest records one per line (.jsonl),
and raw generator rows (.jsonl). `load_tasks("sample")` reads the 40 official test records shipped with the package.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from envs_py.textworld_sync.tasks import (
    DIFFICULTIES, GAMES, TaskSpec, manifest_row_from_raw, task_from_manifest_row,
)

# V9 dataset names per split; earlier versions (V6-V8) are accepted by pattern since only V9 is shipped.
V9_DATASETS = {
    "TextWorldExpress-MultiDish-V9-Test": "test",
    "TextWorldExpress-MultiDish-V9-Validation": "validation",
    "TextWorldExpress-MultiDish-V9-Train": "train",
}
_OLDER = re.compile(r"^TextWorldExpress-[A-Za-z]+-V[6-8](-[A-Za-z]+)?$")
SAMPLE_FILES = {"sample": "test_sample_manifest_rows.jsonl", "sample_raw": "test_sample_raw_rows.jsonl"}


def sample_path(form: str = "sample") -> Path:
    """Returns the path of a shipped sample file: 'sample' (manifest rows) or 'sample_raw' (raw rows)."""
    return Path(str(resources.files("envs_py.textworld_sync") / "data" / SAMPLE_FILES[form]))


def load_tasks(path: str | Path) -> list[TaskSpec]:
    """Returns the tasks of a manifest .json, a manifest-rows .jsonl or a raw-rows .jsonl file, in file order.

    `path` may also be 'sample' / 'sample_raw' (the 40 shipped official test records). Raises ValueError on a
    malformed file or a manifest that breaks the validation rules of docs/design/textworld.md §2.2."""
    if str(path) in SAMPLE_FILES:
        path = sample_path(str(path))
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix == ".json" or (stripped.startswith("{") and '"tasks"' in stripped[:4096] and "\n{" not in text):
        try:
            manifest = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from exc
        if isinstance(manifest, dict) and "tasks" in manifest:
            return tasks_from_manifest(manifest, str(path))
        raise ValueError(f"{path}: a manifest must be a JSON object with a 'tasks' list")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON: {exc}") from exc
    return tasks_from_rows(rows, str(path))


def tasks_from_rows(rows: Iterable[dict], where: str = "rows") -> list[TaskSpec]:
    """Returns tasks from manifest-form or raw-form rows (detected per row); checks ids are unique."""
    tasks = []
    for row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: every row must be a JSON object")
        if "generation_properties" not in row:
            row = manifest_row_from_raw(row)
        task = task_from_manifest_row(row)
        _check_task(task, where)
        tasks.append(task)
    _check_unique(tasks, where)
    return tasks


def tasks_from_manifest(manifest: dict, where: str = "manifest") -> list[TaskSpec]:
    """Returns the tasks of a parsed manifest after the loader's validation rules (docs/design/textworld.md §2.2)."""
    dataset = str(manifest.get("dataset", ""))
    split = manifest.get("split")
    if dataset in V9_DATASETS:
        if split != V9_DATASETS[dataset]:
            raise ValueError(f"{where}: dataset {dataset} needs split {V9_DATASETS[dataset]!r}, got {split!r}")
    elif not _OLDER.match(dataset):
        raise ValueError(f"{where}: unsupported dataset name {dataset!r}")
    rows = manifest.get("tasks")
    if not isinstance(rows, list):
        raise ValueError(f"{where}: 'tasks' must be a list")
    tasks = tasks_from_rows(rows, where)
    for task in tasks:
        if task.fold != split:
            raise ValueError(f"{where}: task {task.task_id} has fold {task.fold!r}, manifest split is {split!r}")
    if manifest.get("task_count") != len(tasks):
        raise ValueError(f"{where}: task_count {manifest.get('task_count')} != {len(tasks)} tasks")
    return tasks


def _check_task(task: TaskSpec, where: str) -> None:
    if task.game not in GAMES:
        raise ValueError(f"{where}: task {task.task_id} has unknown game {task.game!r}")
    if task.difficulty not in DIFFICULTIES:
        raise ValueError(f"{where}: task {task.task_id} has unknown difficulty {task.difficulty!r}")
    if not task.dishes:
        raise ValueError(f"{where}: task {task.task_id} has no dishes")


def _check_unique(tasks: list[TaskSpec], where: str) -> None:
    counts = collections.Counter(t.task_id for t in tasks)
    dupes = [k for k, n in counts.items() if n > 1]
    if dupes:
        raise ValueError(f"{where}: duplicate task ids: {dupes[:5]}")


def build_manifest(tasks: list[TaskSpec], dataset: str, split: str) -> dict:
    """Returns a manifest object (top-level fields of docs/design/textworld.md §2.2) holding `tasks` in their manifest form."""
    rows = [t.to_manifest_row() for t in tasks]
    body = json.dumps(rows, sort_keys=True).encode()
    return {
        "dataset": dataset, "split": split, "game_selection": "cookingworld_multidish", "schema_version": 1,
        "task_count": len(rows),
        "difficulty_counts": dict(collections.Counter(t.difficulty for t in tasks)),
        "task_family_counts": dict(collections.Counter(t.family for t in tasks)),
        "source_files": [], "source_sha256": hashlib.sha256(body).hexdigest(), "tasks": rows,
    }


def write_manifest(tasks: list[TaskSpec], path: str | Path, dataset: str, split: str) -> Path:
    """Writes a manifest JSON (indent 2, sorted keys) and returns its path."""
    path = Path(path)
    path.write_text(json.dumps(build_manifest(tasks, dataset, split), indent=2, sort_keys=True) + "\n")
    return path


def write_rows(tasks: list[TaskSpec], path: str | Path, raw: bool = True) -> Path:
    """Writes one JSON object per line (raw rows, or manifest rows when raw=False), sorted keys; returns the path."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task.to_raw_row() if raw else task.to_manifest_row(), sort_keys=True) + "\n")
    return path


def task_dict(task: Any) -> dict[str, Any]:
    """Returns a task's manifest-form record (for shipping a task to a worker process)."""
    return task.to_manifest_row() if isinstance(task, TaskSpec) else dict(task)
