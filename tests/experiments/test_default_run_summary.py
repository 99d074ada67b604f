"""The default run's summary: one evaluation's success per tier, overall, and over the official records and the
generated held-out tasks when a set mixes them, each with the binomial sd of one evaluation."""

from __future__ import annotations

import math

import pytest

from sera_jax.experiments.default_run import _table_md, success_table


def _rep(rows):
    return {"tasks": [[{"task_id": i, "difficulty": d, "success": ok} for i, d, ok in rows]]}


def test_tiers_overall_and_sources_with_binomial_sd():
    gen = "cookingworld_multidish_test900000_conflict_easy_{:04d}"
    off = "cookingworld_multidish_test_multi_dish_fork_join_{}_0000"
    rows = [(gen.format(k), "easy", k < 3) for k in range(8)] + \
        [(off.format("easy"), "easy", True), (off.format("hard"), "hard", False), (off.format("medium"), "medium",
                                                                                 None)]  # None: errored = failed
    table = {r["group"]: r for r in success_table(_rep(rows))}
    assert list(table) == ["easy", "medium", "hard", "overall", "official records", "generated held-out"]
    easy = table["easy"]
    assert (easy["n"], easy["successful"]) == (9, 4) and easy["rate"] == pytest.approx(100 * 4 / 9)
    assert easy["binomial_sd"] == pytest.approx(100 * math.sqrt(4 / 9 * 5 / 9 / 9))
    assert (table["overall"]["n"], table["overall"]["successful"]) == (11, 4)
    assert (table["official records"]["n"], table["official records"]["successful"]) == (3, 1)
    assert (table["generated held-out"]["n"], table["generated held-out"]["successful"]) == (8, 3)
    assert table["hard"]["binomial_sd"] == 0.0
    md = _table_md(None, list(table.values()))
    assert "| easy | 9 | n/a | 44.4% ± 16.6 |" in md


def test_a_set_of_one_source_has_no_source_rows():
    rows = [(f"cookingworld_multidish_test_conflict_easy_{k:04d}", "easy", True) for k in range(4)]
    assert [r["group"] for r in success_table(_rep(rows))] == ["easy", "overall"]
