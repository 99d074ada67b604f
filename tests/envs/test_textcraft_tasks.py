"""Official task sets as package data, the loader's forms, and the step budget as a runtime setting."""

import json

import pytest

from envs_py.textcraft import DEFAULT_MAX_STEPS, TextCraftWorld, load_tasks, save_tasks
from envs_py.textcraft.tasks import task_to_row


@pytest.fixture(scope="module")
def val():
    return load_tasks("val")


def test_val_set(val):
    assert [t.task_id for t in val] == [f"textcraft_synth.val.{i}" for i in range(632)]
    counts = {d: sum(t.difficulty == d for t in val) for d in ("easy", "medium", "hard", "extreme")}
    assert counts == {"easy": 147, "medium": 213, "hard": 136, "extreme": 136}
    pairs = {tuple(t.payload["target_items"].items())[0] for t in val}
    assert len(pairs) == 632


def test_train_medium_set(val):
    train = load_tasks("train")
    assert len(train) == 852 and all(t.difficulty == "medium" for t in train)
    ids = [int(t.task_id.rsplit(".", 1)[1]) for t in train]
    assert ids == sorted(ids)
    train_items = {next(iter(t.payload["target_items"])) for t in train}
    val_items = {next(iter(t.payload["target_items"])) for t in val}
    assert not train_items & val_items and len(train_items) == 284


def test_budget_is_a_runtime_setting_not_the_row(val):
    t = val[0]
    assert t.payload["stored_max_steps"] == 75
    assert DEFAULT_MAX_STEPS == 20
    assert "budget of 20 steps" in TextCraftWorld.from_task(t).observe("root")
    assert "budget of 7 steps" in TextCraftWorld.from_task(t, max_steps=7).observe("root")


def test_load_from_paths(tmp_path, val):
    save_tasks(val[:5], tmp_path / "a.jsonl")
    save_tasks(val[:5], tmp_path / "a.jsonl.gz")
    assert [task_to_row(t) for t in load_tasks(tmp_path / "a.jsonl")] == [task_to_row(t) for t in val[:5]]
    assert load_tasks(str(tmp_path / "a.jsonl.gz")) == load_tasks(tmp_path / "a.jsonl")
    p = val[0].payload
    upstream = {"goal": val[0].goal, "id": "x.1", "max_steps": 75, "fork_strategy": "subtask",
                "misc": {"target_items": p["target_items"], "initial_inventory": p["initial_inventory"],
                         "gold_trajectory": p["gold_trajectory"], "difficulty": "easy", "max_depth": 2,
                         "num_craft_steps": 2}}
    (tmp_path / "u.json").write_text(json.dumps([upstream]))
    (t,) = load_tasks(tmp_path / "u.json")
    assert t.task_id == "x.1" and t.difficulty == "easy" and t.payload["target_items"] == p["target_items"]
    with pytest.raises(FileNotFoundError):
        load_tasks("no-such-set")
