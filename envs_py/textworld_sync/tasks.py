"""Task records of TextWorld-Sync: the `TaskSpec` type and conversion between the manifest and raw row forms.

Manifest form (docs/design/textworld.md §2.3): {task_id, game, fold, difficulty, seed, game_params (compact JSON string),
task_description, generation_properties={base_game, task_family, task_view, task_descriptions, dishes, parallelism,
generation}}. Raw form: the same content un-projected, with `game_params` as an object (docs/design/textworld.md §2.3, last paragraph).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from envs_py.core import Task

GAME = "cookingworld_multidish"
GAMES = frozenset({"cookingworld", "twc", "cookingworld_multidish"})
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard", "extreme")
_GEN_PROP_KEYS = ("base_game", "task_family", "task_view", "task_descriptions", "dishes", "parallelism", "generation")


def compact_json(obj: Any) -> str:
    """Returns `obj` as compact JSON with sorted keys (the manifest's `game_params` string form)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, eq=False)
class TaskSpec(Task):
    """One TextWorld-Sync task. `goal` is the task description; `payload` is the manifest-form record."""

    game: str = GAME
    fold: str = "test"
    seed: int = 0
    game_params: str = "{}"
    generation_properties: dict = dataclasses.field(default_factory=dict)

    @property
    def task_description(self) -> str:
        return self.goal

    @property
    def params(self) -> dict:
        """Returns `game_params` parsed into a dict."""
        return json.loads(self.game_params) if self.game_params else {}

    @property
    def family(self) -> str:
        return str(self.generation_properties.get("task_family", ""))

    @property
    def dishes(self) -> list[dict]:
        return list(self.generation_properties.get("dishes", []))

    @property
    def parallelism(self) -> dict:
        return dict(self.generation_properties.get("parallelism") or {})

    @property
    def max_steps(self) -> int:
        """Returns the global (shared) action budget, 100 when the record has none (docs/design/textworld.md §5.3)."""
        value = self.parallelism.get("shared_environment_max_steps")
        return 100 if value is None else int(value)

    def to_manifest_row(self) -> dict:
        """Returns the manifest-form record (a fresh dict)."""
        return {
            "task_id": self.task_id, "game": self.game, "fold": self.fold, "difficulty": self.difficulty,
            "seed": self.seed, "game_params": self.game_params, "task_description": self.goal,
            "generation_properties": self.generation_properties,
        }

    def to_raw_row(self) -> dict:
        """Returns the raw JSONL-row form of this task (a fresh dict)."""
        gp = self.generation_properties
        return {
            "schema_version": 1, "task_id": self.task_id, "game": self.game,
            "base_game": gp.get("base_game", "cookingworld"), "task_family": gp.get("task_family"),
            "split": self.fold, "source_fold": gp.get("generation", {}).get("source_db_fold", self.fold),
            "difficulty": self.difficulty, "seed": self.seed, "task_view": gp.get("task_view"),
            "task_description": self.goal, "task_descriptions": gp.get("task_descriptions"),
            "game_params": self.params, "dishes": gp.get("dishes"), "parallelism": gp.get("parallelism"),
            "generation": gp.get("generation"),
        }


def task_from_manifest_row(row: Mapping[str, Any]) -> TaskSpec:
    """Returns the TaskSpec of one manifest-form record (raises ValueError on a malformed record)."""
    try:
        game_params = row["game_params"]
        if not isinstance(game_params, str):
            game_params = compact_json(game_params)
        record = dict(row)
        record["game_params"] = game_params
        return TaskSpec(
            task_id=str(row["task_id"]), difficulty=str(row["difficulty"]), goal=str(row["task_description"]),
            payload=record, game=str(row.get("game", GAME)), fold=str(row.get("fold", "test")),
            seed=int(row.get("seed", 0)), game_params=game_params,
            generation_properties=dict(row.get("generation_properties") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed TextWorld-Sync manifest record: {exc!r}") from exc


def manifest_row_from_raw(raw: Mapping[str, Any]) -> dict:
    """Returns the manifest-form record of one raw JSONL row (the projection of docs/design/textworld.md §2.3)."""
    try:
        return {
            "task_id": raw["task_id"], "game": raw.get("game", GAME), "fold": raw.get("split", "test"),
            "difficulty": raw["difficulty"], "seed": raw.get("seed", 0),
            "game_params": compact_json(raw.get("game_params") or {}),
            "task_description": raw["task_description"],
            "generation_properties": {key: raw.get(key) for key in _GEN_PROP_KEYS},
        }
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed TextWorld-Sync raw row: {exc!r}") from exc


def as_task_spec(task: Any) -> TaskSpec:
    """Returns a TaskSpec for a TaskSpec, a core Task whose payload is a row, or a row dict (either form)."""
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, Task):
        task = task.payload
    if isinstance(task, Mapping):
        if "generation_properties" in task:
            return task_from_manifest_row(task)
        if "dishes" in task:
            return task_from_manifest_row(manifest_row_from_raw(task))
    raise ValueError("not a TextWorld-Sync task: expected a TaskSpec, a Task with a row payload, or a row dict")
