"""TextWorld task-set specs: files, the sample, folds, seeded generated sets and their unions; the tiny default's
training and held-out sets share no task, with each other or with the official records."""

from __future__ import annotations

import json

import pytest

from envs_py.textworld_sync import generate_tasks, load_tasks
from envs_py.textworld_sync.task_sets import load_task_set, task_set_error


def _content(task) -> str:
    return json.dumps(task.dishes, sort_keys=True)


def test_a_seeded_set_is_the_fold_layout_from_another_base_seed():
    tasks, files = load_task_set("test@900000?difficulties=easy&per_cell=2")
    assert files == [] and len(tasks) == 14  # 7 families x 2
    assert {t.difficulty for t in tasks} == {"easy"}
    assert [t.seed for t in tasks[:3]] == [900000, 900001, 900100]
    assert tasks[0].task_id == "cookingworld_multidish_test900000_multi_dish_fork_join_easy_0000"
    # The same seed gives the same task as the generator's, under an id that names the seed range.
    plain = generate_tasks("test", base_seed=900000, difficulties=["easy"], per_cell=2)
    assert [_content(t) for t in tasks] == [_content(t) for t in plain]
    assert [t.task_id for t in plain][0] == "cookingworld_multidish_test_multi_dish_fork_join_easy_0000"


def test_a_union_keeps_part_order_and_refuses_duplicate_ids(tmp_path):
    tasks, _ = load_task_set("test@900000?difficulties=easy&families=conflict&per_cell=3+sample")
    assert len(tasks) == 3 + 40 and tasks[3].task_id == load_tasks("sample")[0].task_id
    with pytest.raises(ValueError, match="duplicate task ids"):
        load_task_set("sample+sample")
    with pytest.raises(ValueError, match="no task file"):
        load_task_set(str(tmp_path / "missing.jsonl"))


def test_tiny_default_sets_are_disjoint():
    """The tiny TextWorld default trains on seeds 700000.. and holds out 900000.. and the official records: no
    task (its dishes, ingredients and preparations) is in two of them."""
    train, _ = load_task_set("test@700000?difficulties=easy")
    held, _ = load_task_set("test@900000?difficulties=easy&per_cell=16")
    official = load_tasks("sample")
    assert len(train) == 350 and len(held) == 112
    a, b, c = ({_content(t) for t in s} for s in (train, held, official))
    assert not (a & b) and not (a & c) and not (b & c)


@pytest.mark.parametrize("spec, error", [
    ("test@900000?per_cell=0", "per_cell"),
    ("test@900000?difficulties=trivial", "difficulties"),
    ("test@900000?colour=red", "unknown option"),
    ("nowhere@1", "unknown fold"),
    ("test@abc", "expected a .json/.jsonl path"),
    ("tasks.csv", "expected a .json/.jsonl path"),
])
def test_malformed_specs_are_named(spec, error):
    assert error in (task_set_error(spec) or "")
    with pytest.raises(ValueError, match="task set"):
        load_task_set(spec)


def test_well_formed_specs_pass_without_generating():
    for spec in ("sample", "train", "dev", "test@1", "test@700000?difficulties=easy,medium&per_cell=4+sample",
                 "some/file.jsonl"):
        assert task_set_error(spec) is None, spec
    assert "no task file" in task_set_error("some/file.jsonl", check_paths=True)
