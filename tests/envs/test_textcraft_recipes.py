"""The recipe world: the generator reproduces the packaged official world; shapes of the spec's §1."""

import json
import re

from envs_py.textcraft.generator import split_items
from envs_py.textcraft.recipes import official_recipes, world_meta
from envs_py.textcraft.worldgen import generate_world


def test_generator_reproduces_official_world_exactly():
    gen, off = generate_world(42, 25), official_recipes()
    assert len(off.recipes) == 1402
    assert json.dumps(gen.to_json()) == json.dumps(off.to_json())  # same recipes, same key orders
    assert gen.items_by_tier == off.items_by_tier


def test_tier_sizes_names_and_base_items():
    book = official_recipes()
    per_tier = [sum(1 for r in book.recipes.values() if r.depth == t) for t in range(1, 13)]
    assert per_tier == [125, 125, 120, 120, 120, 115, 115, 115, 110, 114, 114, 109]
    assert len(book.base_items) == 50 and all(book.is_base_item(b) and not book.can_craft(b) for b in book.base_items)
    assert book.crafting_depth("no_such_item") == 0 and book.crafting_depth("m0_ore") == 0
    for name, r in book.recipes.items():
        assert r.result_item == name
        assert all(book.crafting_depth(i) < r.depth for i in r.ingredients)  # ingredients are shallower
        if name.startswith("x"):
            continue
        t = r.depth
        assert re.fullmatch(rf"[mcoat]\d_i{t}" + ("" if t <= 5 else f"_{t}") + r"(_\d+)?", name), name
        lo, hi = {1: (2, 4), 2: (2, 3)}.get(t, (1, 2) if t <= 5 else (1, 1))
        assert lo <= r.result_count <= hi
    assert [x for x in book.recipes if x.startswith("x")] == [
        "x10_mc", "x10_ot", "x10_am", "x10_ct", "x11_mct", "x11_oam", "x11_act", "x11_tca",
        "x12_mcat", "x12_oacm", "x12_tcoa", "x12_all"]


def test_item_split_matches_metadata():
    train, val, _ = split_items(official_recipes(), 42)
    meta = world_meta()["train_val_item_split"]
    for t in range(1, 13):
        assert train[t] == meta[str(t)]["train"] and val[t] == meta[str(t)]["val"]
        assert not set(train[t]) & set(val[t])
    assert [len(val[t]) for t in range(1, 13)] == [25, 25, 24, 24, 24, 23, 23, 23, 22, 23, 23, 22]


def test_other_worlds_are_deterministic_and_well_formed():
    a, b = generate_world(7, 8), generate_world(7, 8)
    assert a.to_json() == b.to_json() and a.to_json() != generate_world(8, 8).to_json()
    assert len(a.recipes) == sum(5 * max(1, 8 - t // 3) for t in range(1, 13)) + 12
