"""Tool semantics and exact messages (docs/design/textcraft.md §7); bad input never raises and never changes the
inventory."""

from envs_py.textcraft import official_recipes
from envs_py.textcraft import tools as T

BOOK = official_recipes()
R = BOOK.recipe("o3_i1")  # {raw_o5: 2} -> 4


def inv():
    return {"raw_o5": 10, "raw_o7": 3}


def test_craft_success_and_inventory_update():
    i = inv()
    assert T.craft(BOOK, i, {"raw_o5": 4}, ("o3_i1", 8)) == "Successfully crafted 8 o3_i1(s)"
    assert i == {"raw_o5": 6, "raw_o7": 3, "o3_i1": 8}
    assert T.craft(BOOK, i, {"raw_o5": 6}, ("o3_i1", 12)).startswith("Successfully")
    assert "raw_o5" not in i and T.view_inventory(i) == {"raw_o7": 3, "o3_i1": 20}


def test_craft_error_messages():
    cases = [
        (["raw_o5"], ("o3_i1", 4), "Error: ingredients must be a dict, got list"),
        ({"raw_o5": 2}, ["o3_i1", 4], "Error: target must be a tuple of (item_name, count)"),
        ({"raw_o5": 2}, (3, 4), "Error: target item must be a string, got int"),
        ({"raw_o5": 2}, ("o3_i1", 4.0), "Error: target count must be an int, got float"),
        ({"raw_o5": 2}, ("o3_i1", 0), "Error: target count must be positive, got 0"),
        ({1: 2}, ("o3_i1", 4), "Error: ingredient name must be a string, got int"),
        ({"raw_o5": "2"}, ("o3_i1", 4), "Error: ingredient count for raw_o5 must be an int, got str"),
        ({"raw_o5": -2}, ("o3_i1", 4), "Error: ingredient count for raw_o5 must be positive, got -2"),
        ({"raw_o5": 2}, ("nope", 4), "Error: No recipe found for nope"),
    ]
    fail = "Error: All 1 recipe(s) failed for o3_i1. Errors:\nRecipe 1: "
    cases += [
        ({"raw_o5": 2}, ("o3_i1", 3), fail + "Target count 3 is not divisible by recipe result count 4"),
        ({"raw_o7": 2}, ("o3_i1", 4), fail + "Missing required ingredient raw_o5"),
        ({"raw_o5": 3}, ("o3_i1", 4), fail + "Wrong amount of raw_o5. Need 2, provided 3"),
        ({"raw_o5": 2, "raw_o7": 1, "x": 1}, ("o3_i1", 4), fail + "Extra ingredients not required: raw_o7, x"),
        ({"raw_o5": 12}, ("o3_i1", 24), fail + "Insufficient ingredients in inventory: raw_o5: need 12, have 10"),
    ]
    for ingredients, target, want in cases:
        i = inv()
        assert T.craft(BOOK, i, ingredients, target) == want
        assert i == inv()
    i = inv()
    assert T.craft(BOOK, i, {"raw_o5": True}, ("o3_i1", 2)).startswith("Error")  # bool is an int, amount wrong
    assert T.craft(BOOK, i, {"raw_o5": 2}, ("o3_i1", 4)).startswith("Successfully")


def test_get_info():
    (info,) = T.get_info(BOOK, {"o3_i1": 2}, ["o3_i1"])
    assert info == {"item": "o3_i1", "can_craft": True, "is_base": False, "in_inventory": 2, "crafting_depth": 1,
                    "recipes": [{"ingredients": {"raw_o5": 2}, "result_count": 4}]}
    base, unknown = T.get_info(BOOK, {}, ["raw_o5", "zzz"])
    assert base["is_base"] and not base["can_craft"] and base["recipes"] == []
    assert unknown == {"item": "zzz", "can_craft": False, "is_base": False, "in_inventory": 0, "crafting_depth": 0,
                       "recipes": []}
    assert T.get_info(BOOK, {}, 5).startswith("Error")
