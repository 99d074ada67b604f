"""The TextWorld-Sync task generator: fold layouts, bands, seeds, determinism, solvability (docs/design/textworld.md §2.4-§4, §13)."""

import collections
import json

import pytest

from envs_py.textworld_sync import generate_task, generate_tasks, load_tasks, oracle_actions
from envs_py.textworld_sync.bands import FAMILIES, PARAMETER_BANDS, RUNTIME_BANDS
from envs_py.textworld_sync.catalog import INGREDIENTS, branch_work
from envs_py.textworld_sync.generator import build_task
from envs_py.textworld_sync.solver import replay

D = {"easy": 0, "medium": 1, "hard": 2, "extreme": 3}


@pytest.fixture(scope="module")
def test_fold():
    return generate_tasks("test")


def _in_band(value, band):
    return value in band["choices"] if "choices" in band else band["min"] <= value <= band["max"]


def test_official_records_are_rebuilt_exactly_from_their_sampled_values():
    # Every derived field (game_params, parallelism, dependencies, both descriptions) follows our formulas.
    for task in load_tasks("sample"):
        gp = task.generation_properties
        gen = gp["generation"]
        rebuilt = build_task(gp["task_family"], task.difficulty, "test", task.seed, int(task.task_id[-4:]),
                             gen["v7_sampled_parameters"], gen["v7_sampled_runtime"], gp["dishes"])
        assert json.dumps(rebuilt.to_manifest_row(), sort_keys=True) == json.dumps(task.to_manifest_row(),
                                                                                      sort_keys=True)


def test_test_fold_layout_counts_and_seeds(test_fold):
    assert len(test_fold) == 1400
    assert collections.Counter(t.difficulty for t in test_fold) == {d: 350 for d in D}
    assert collections.Counter(t.family for t in test_fold) == {f: 200 for f in FAMILIES}
    for position, task in enumerate(test_fold):
        d, rest = divmod(position, 350)
        f, offset = divmod(rest, 50)
        difficulty, family = list(D)[d], FAMILIES[f]
        assert task.task_id == f"cookingworld_multidish_test_{family}_{difficulty}_{offset:04d}"
        assert task.seed == 820000 + 1000 * d + 100 * f + offset
        assert task.fold == "test" and task.generation_properties["generation"]["source_db_fold"] == "test"
    ids = {t.task_id: t.seed for t in test_fold}
    assert ids["cookingworld_multidish_test_critical_path_easy_0001"] == 820101
    assert ids["cookingworld_multidish_test_hierarchical_extreme_0049"] == 823649


def test_dev_and_train_layouts():
    dev = generate_tasks("dev")
    assert len(dev) == 200 and {t.fold for t in dev} == {"validation"}
    assert collections.Counter(t.family for t in dev) == {f: (32 if f == "multi_dish_fork_join" else 28)
                                                          for f in FAMILIES}
    assert all("_dev_" in t.task_id for t in dev)
    assert dev[0].seed == 860000 and dev[-1].seed == 860000 + 300000 + 200 * 6 + 6
    train = generate_tasks("train", per_cell=2)
    assert {t.difficulty for t in train} == {"medium", "hard", "extreme"}
    by_id = {t.task_id: t.seed for t in train}
    assert by_id["cookingworld_multidish_train_critical_path_medium_0001"] == 850000 + 200 + 1
    assert by_id["cookingworld_multidish_train_conflict_extreme_0000"] == 850000 + 100000 + 200 * 5
    assert by_id["cookingworld_multidish_train_hierarchical_hard_0001"] == 850000 + 200000 + 200 * 6 + 1
    counts = collections.Counter()
    from envs_py.textworld_sync.bands import fold_layout
    layout = fold_layout("train")
    for difficulty, count in layout.difficulty_counts:
        for family, n in zip(FAMILIES, layout.family_counts(count)):
            counts[family] += n
    assert [counts[f] for f in FAMILIES] == [216, 216, 215, 214, 213, 213, 213]


def test_bands_and_family_rules(test_fold):
    for task in test_fold:
        gen = task.generation_properties["generation"]
        prof, run = gen["v7_sampled_parameters"], gen["v7_sampled_runtime"]
        assert gen["v7_parameter_band"] == PARAMETER_BANDS[task.difficulty]
        for key, band in PARAMETER_BANDS[task.difficulty].items():
            assert _in_band(prof[key], band), (task.task_id, key)
        for key, band in RUNTIME_BANDS[task.difficulty].items():
            assert _in_band(run[key], band), (task.task_id, key)
        params, par = task.params, task.parallelism
        dishes = task.dishes
        assert params["numDishes"] == len(dishes) == prof["dish_count"] == par["branches"]
        assert all(len(d["recipe"]) == prof["ingredients_per_dish"] for d in dishes)
        names = [r["name"] for d in dishes for r in d["recipe"]]
        assert len(names) == len(set(names)) == params["numIngredientsTotal"]
        for d in dishes:
            n_prepared = sum(r["requires_preparation"] for r in d["recipe"])
            assert prof["min_prepared_ingredients_per_dish"] <= n_prepared <= prof["max_prepared_ingredients_per_dish"]
        assert par["shared_environment_max_steps"] == task.max_steps == run["shared_environment_max_steps"]
        assert params["includeDoors"] == int(prof["include_doors"] or task.family == "dependency_gate")
        assert (task.generation_properties["task_view"] == "coarse") == (task.difficulty == "extreme")
        if task.family == "dependency_gate":
            assert [e["to"] for e in par["dependencies"]] == [d["dish_id"] for d in dishes[1:]]
            assert "behind an access gate" in task.goal
        if task.family == "resource_constrained":
            assert par["resource_capacity"] == {"inventory": prof["inventory_capacity"]}
        if task.family == "conflict":
            assert par["resource_capacity"] == {"knife": 1, "stove": 1} and par["resource_conflict"]
        if task.family == "hierarchical":
            assert par["hierarchy_depth"] == 2 and len(par["dependencies"]) == len(dishes) + len(names)
        if task.family in ("critical_path", "load_balanced"):
            # The last dish takes its ingredients' most laborious options, the leading ones the least laborious.
            lead = len(dishes) - (2 if task.family == "critical_path" else 1)
            for k, dish in enumerate(dishes):
                for r in dish["recipe"]:
                    options = [o for o in INGREDIENTS[r["name"]][1]
                               if not r["requires_preparation"] or set(o) != {"raw", "uncut"}]
                    works = [branch_work(o) for o in options]
                    if k == len(dishes) - 1:
                        assert r["branch_work"] == max(works), task.task_id
                    elif k < lead:
                        assert r["branch_work"] == min(works), task.task_id


def test_same_seed_same_task():
    a = generate_task("conflict", "hard", 123456)
    b = generate_task("conflict", "hard", 123456)
    c = generate_task("conflict", "hard", 123457)
    assert a.to_manifest_row() == b.to_manifest_row()
    assert a.to_manifest_row() != c.to_manifest_row()
    assert [t.to_manifest_row() for t in generate_tasks("test", per_cell=2)] == \
           [t.to_manifest_row() for t in generate_tasks("test", per_cell=2)]
    fresh = generate_tasks("test", base_seed=10_000_000, per_cell=1)
    assert fresh[0].seed == 10_000_000 and fresh[0].to_manifest_row() != generate_tasks("test", per_cell=1)[0]


def test_every_generated_test_task_is_solved_by_the_oracle_within_budget(test_fold):
    for task in test_fold:
        actions = oracle_actions(task)
        assert len(actions) <= task.max_steps, task.task_id
        assert replay(task, actions).check().success, task.task_id


def test_generated_dev_and_train_tasks_are_solvable():
    for task in generate_tasks("dev") + generate_tasks("train", per_cell=8):
        actions = oracle_actions(task)
        assert len(actions) <= task.max_steps and replay(task, actions).check().success, task.task_id
