"""Loading the official TextWorld-Sync records in every form (docs/design/textworld.md §2)."""

import json

import pytest

from envs_py.core import Env, Task
from envs_py.textworld_sync import load_tasks, make_world, sample_path, write_manifest, write_rows
from envs_py.textworld_sync.loader import build_manifest
from envs_py.textworld_sync.tasks import TaskSpec, manifest_row_from_raw

SHARED = "/work/shared/data/textworld_sync"


def _rows(form):
    return [json.loads(line) for line in sample_path(form).read_text().splitlines() if line.strip()]


def test_every_sample_loads_in_both_forms():
    manifest_rows = load_tasks("sample")
    raw_rows = load_tasks(sample_path("sample_raw"))
    assert len(manifest_rows) == len(raw_rows) == 40
    for a, b in zip(manifest_rows, raw_rows):
        assert isinstance(a, TaskSpec) and isinstance(a, Task)
        assert a.task_id == b.task_id and a.difficulty == b.difficulty and a.goal == b.goal
        assert a.to_manifest_row() == b.to_manifest_row()
    assert {t.difficulty for t in manifest_rows} == {"easy", "medium", "hard", "extreme"}
    assert len({t.family for t in manifest_rows}) == 7


def test_raw_rows_project_to_manifest_rows_exactly():
    for raw, row in zip(_rows("sample_raw"), _rows("sample")):
        assert manifest_row_from_raw(raw) == row
    for task, raw in zip(load_tasks("sample"), _rows("sample_raw")):
        assert task.to_raw_row() == raw


def test_package_data_matches_shared_reference(tmp_path):
    import os
    if os.path.isdir(SHARED):
        for name in ("test_sample_manifest_rows.jsonl", "test_sample_raw_rows.jsonl"):
            with open(os.path.join(SHARED, name)) as fh:
                assert fh.read() == sample_path("sample" if "manifest" in name else "sample_raw").read_text()


def test_manifest_json_roundtrip(tmp_path):
    tasks = load_tasks("sample")
    path = write_manifest(tasks, tmp_path / "m.json", "TextWorldExpress-MultiDish-V9-Test", "test")
    again = load_tasks(path)
    assert [t.to_manifest_row() for t in again] == [t.to_manifest_row() for t in tasks]
    manifest = json.loads(path.read_text())
    assert manifest["task_count"] == 40 and sum(manifest["difficulty_counts"].values()) == 40
    raw = write_rows(tasks, tmp_path / "r.jsonl")
    rows = write_rows(tasks, tmp_path / "m.jsonl", raw=False)
    assert [t.task_id for t in load_tasks(raw)] == [t.task_id for t in load_tasks(rows)] == [t.task_id for t in tasks]


def test_manifest_validation_rules(tmp_path):
    tasks = load_tasks("sample")

    def write(manifest):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(manifest))
        return path

    good = build_manifest(tasks, "TextWorldExpress-MultiDish-V9-Test", "test")
    with pytest.raises(ValueError, match="split"):
        load_tasks(write(dict(good, split="train")))
    with pytest.raises(ValueError, match="unsupported dataset"):
        load_tasks(write(dict(good, dataset="Something-Else")))
    with pytest.raises(ValueError, match="task_count"):
        load_tasks(write(dict(good, task_count=41)))
    with pytest.raises(ValueError, match="duplicate"):
        load_tasks(write(dict(good, tasks=good["tasks"] + good["tasks"][:1], task_count=41)))
    bad = json.loads(json.dumps(good))
    bad["tasks"][0]["difficulty"] = "impossible"
    with pytest.raises(ValueError, match="difficulty"):
        load_tasks(write(bad))
    bad = json.loads(json.dumps(good))
    bad["tasks"][0]["fold"] = "train"
    with pytest.raises(ValueError, match="fold"):
        load_tasks(write(bad))
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tasks(tmp_path / "junk.jsonl")


def test_world_factory_accepts_every_task_form():
    task = load_tasks("sample")[5]
    generic = Task(task_id=task.task_id, difficulty=task.difficulty, goal=task.goal, payload=task.to_raw_row())
    worlds = [make_world(task), make_world(task.to_manifest_row()), make_world(task.to_raw_row()), make_world(generic)]
    assert len({w.digest() for w in worlds}) == 1
    assert all(isinstance(w, Env) for w in worlds)
    with pytest.raises(ValueError):
        make_world({"nothing": 1})
    with pytest.raises(ValueError):
        make_world(task, rules="lenient")


def test_public_api_names():
    from envs_py.textworld_sync import generate_tasks, load_tasks as lt  # noqa: F401  (docs/design/house.md names)
    t = lt("sample")[0]
    assert t.task_id == "cookingworld_multidish_test_multi_dish_fork_join_easy_0000" and t.difficulty == "easy"
    assert t.seed == 820000 and t.max_steps == 116 and t.family == "multi_dish_fork_join"
