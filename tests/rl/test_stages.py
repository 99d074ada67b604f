"""Stage kernel (docs/design/algorithm.md §7) and method switches (docs/design/algorithm.md §8)."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from sera_jax.rl.stages import METHODS, MethodConfig, method_config, parse_schedule, position, stage_for_version


def test_routing_vectors_section_13():
    assert stage_for_version(15) == "execution"
    assert stage_for_version(16) == "delegation"
    assert stage_for_version(18) == "rubric_generation"
    assert stage_for_version(20) == "execution"
    assert position(20).cycle == 1 and position(20).offset == 0
    assert [stage_for_version(v) for v in (0, 17, 19)] == ["execution", "delegation", "rubric_generation"]


def test_250_steps_split_202_24_24():
    counts = collections.Counter(stage_for_version(v) for v in range(250))
    assert counts == {"execution": 202, "delegation": 24, "rubric_generation": 24}
    assert position(249).offset == 9  # the last cycle stops at offset 9


def test_other_schedules():
    assert {stage_for_version(v, "execution:1") for v in range(50)} == {"execution"}
    rao_d = [stage_for_version(v, "execution:12,delegation:4") for v in range(16)]
    assert rao_d == ["execution"] * 12 + ["delegation"] * 4
    rt = "execution:16,rubric_generation:2"
    assert [stage_for_version(v, rt) for v in (15, 16, 17, 18)] == ["execution", "rubric_generation",
                                                                    "rubric_generation", "execution"]
    assert parse_schedule(" execution : 3 , delegation:1") == (("execution", 3), ("delegation", 1))
    for bad in ("", "execution", "execution:0", "training:3", "execution:2,foo:1"):
        with pytest.raises(ValueError):
            parse_schedule(bad)
    with pytest.raises(ValueError):
        stage_for_version(-1)


def test_method_table_section_8():
    assert set(METHODS) == {"SERA", "SERA w/o D", "SERA w/o D & RT", "RAO", "RAO+D", "RAO+RT", "Rank+Disc"}
    table = {n: (m.execution_reward, m.stage_schedule, m.ranking_objective) for n, m in METHODS.items()}
    assert table == {
        "RAO": ("rao", "execution:1", "hinge"),
        "RAO+D": ("rao", "execution:12,delegation:4", "hinge"),
        "RAO+RT": ("rao", "execution:16,rubric_generation:2", "hinge"),
        "SERA w/o D & RT": ("rubric", "execution:1", "hinge"),
        "SERA w/o D": ("rubric", "execution:16,rubric_generation:2", "hinge"),
        "SERA": ("rubric", "execution:16,delegation:2,rubric_generation:2", "hinge"),
        "Rank+Disc": ("rubric", "execution:16,rubric_generation:2", "order_discrimination"),
    }
    assert {n for n, m in METHODS.items() if m.max_head_offpolicyness == 3} == {"RAO", "SERA w/o D & RT"}
    assert {n for n, m in METHODS.items() if m.seed == 343} == {"RAO", "RAO+D", "SERA w/o D & RT"}
    sera = method_config("sera")
    assert sera is METHODS["SERA"] and sera.uses("delegation") and not METHODS["RAO"].uses("delegation")
    assert (sera.ranking_margin, sera.cispo_ratio_min, sera.cispo_ratio_max, sera.group_size) == (0.2, 0, 5, 8)
    assert sera.depth_level_weighting and sera.depth_level_discount_gamma is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        sera.seed = 1
    with pytest.raises(KeyError):
        method_config("nope")


def test_method_validation():
    with pytest.raises(ValueError):
        MethodConfig("x", "oracle", "execution:1")
    with pytest.raises(ValueError):
        MethodConfig("x", "rubric", "execution:1", order_weight=0.9)
    with pytest.raises(ValueError):
        MethodConfig("x", "rubric", "execution:1,rubric_generation:1", branching_factor=1)
    assert MethodConfig("x", "rubric", "execution:1,rubric_generation:1", branching_factor=4).branching_factor == 4
    assert all(m.branching_factor == 8 for m in METHODS.values())  # the paper's methods fork 8
    with pytest.raises(ValueError):
        MethodConfig("x", "rubric", "execution:1", scoring_temperature=0.5)
