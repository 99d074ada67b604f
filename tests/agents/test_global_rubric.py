"""The shipped global sub-agent rubrics (sera_jax/assets/rubrics/<env>.json): one per registered environment, read
by the same parser as a generated rubric, with the reference's structure (five weighted items, a success gate,
failure conditions, anchors at 0, 0.25, 0.5, 0.75 and 1)."""

from __future__ import annotations

import json

import pytest

from sera_jax.agents import environments
from sera_jax.agents.roles import global_rubric, global_rubric_path, load_rubric_file
from sera_jax.agents.rubric import parse_rubric

WEIGHTS = {"goal_fulfilment": 0.4, "correctness_and_grounding": 0.25, "utility_to_parent": 0.15,
           "action_validity": 0.1, "efficiency": 0.1}


@pytest.mark.parametrize("env", environments.names())
def test_each_environment_ships_a_valid_global_rubric(env):
    text = global_rubric_path(env).read_text()
    parsed, err = parse_rubric(text, 2)  # the parser every generated rubric goes through
    assert err == "" and parsed == global_rubric(env)
    assert {i["name"]: i["weight"] for i in parsed["rubric_items"]} == pytest.approx(WEIGHTS)
    assert all(i["description"] and i["score_0"] and i["score_full"] for i in parsed["rubric_items"])
    assert "exactly 0.0" in parsed["success_gate"] and "success is false" in parsed["success_gate"]
    assert len(parsed["failure_conditions"]) >= 3 and all(parsed["failure_conditions"])
    for anchor in ("0 =", "0.25 =", "0.5 =", "0.75 =", "1 ="):
        assert anchor in parsed["scoring_procedure"]
    # Nothing is dropped or renormalised by parsing: the file is already in the parser's output form.
    assert parsed == json.loads(text)


def test_a_broken_rubric_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"rubric_items": [{"name": "only", "weight": 1, "description": "d"}]}))
    with pytest.raises(ValueError, match=r"rubric file .*r\.json is not a valid rubric: .*fewer"):
        load_rubric_file(bad)
    with pytest.raises(ValueError, match="rubric file .*missing.json"):
        load_rubric_file(tmp_path / "missing.json")
