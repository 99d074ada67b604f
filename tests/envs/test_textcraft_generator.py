"""Task generation: reproduces the official files; bands, counts, determinism and solvability."""

import pytest

from envs_py.textcraft import generate_tasks, load_tasks, recipe_book, simulate
from envs_py.textcraft.generator import BANDS


@pytest.fixture(scope="module")
def both():
    return generate_tasks("both")


def test_defaults_reproduce_the_official_files(both):
    val = [t for t in both if ".val." in t.task_id]
    train_medium = [t for t in both if ".train." in t.task_id and t.difficulty == "medium"]
    assert val == load_tasks("val")
    assert train_medium == load_tasks("train")


def test_band_counts_and_tiers(both):
    book = recipe_book()
    for split, want in (("train", [588, 852, 544, 538]), ("val", [147, 213, 136, 136])):
        rows = [t for t in both if f".{split}." in t.task_id]
        assert [sum(t.difficulty == b for t in rows) for b in BANDS] == want
        for t in rows:
            lo, hi, _, max_count = BANDS[t.difficulty]
            (item, n), = t.payload["target_items"].items()
            assert lo <= book.crafting_depth(item) == t.payload["max_depth"] <= hi and 1 <= n <= max_count
            end = simulate(book, t.payload["initial_inventory"], t.payload["gold_trajectory"])
            assert end is not None and end.get(item, 0) >= n  # every generated task is solvable by its plan


def test_new_world_tasks_are_deterministic_and_solvable():
    kw = dict(seed=3, world_seed=11, items_per_domain_tier=6, n_train=200, n_val=120)
    a, b = generate_tasks("val", **kw), generate_tasks("val", **kw)
    assert a == b and a != generate_tasks("val", **dict(kw, seed=4))
    book = recipe_book(11, 6)
    assert {t.difficulty for t in a} == set(BANDS)
    for t in a:
        p = t.payload
        assert p["world"] == {"seed": 11, "items_per_domain_tier": 6}
        (item, n), = p["target_items"].items()
        # inventory = required base + buffer in [0, max(1, need//2)] + up to 3 distractors of 1..5
        for base, need in p["required_base"].items():
            assert need <= p["initial_inventory"][base] <= need + max(1, need // 2)
        extra = set(p["initial_inventory"]) - set(p["required_base"])
        assert len(extra) <= 3 and all(1 <= p["initial_inventory"][e] <= 5 for e in extra)
        end = simulate(book, p["initial_inventory"], p["gold_trajectory"])
        assert end is not None and end.get(item, 0) >= n
    with pytest.raises(ValueError):
        generate_tasks("test")
    hard = generate_tasks("train", difficulty="hard", **kw)
    assert hard and all(t.difficulty == "hard" for t in hard)
