"""Rubric prompts, parsing and validation, score parsing with the gate rule: the exact vectors of docs/design/algorithm.md §3 and §13."""

import json

import pytest

from sera_jax.agents.rubric import (
    RubricContext,
    extract_json_object,
    parent_context_block,
    parse_rubric,
    parse_score,
    rubric_request,
    score_request,
    truncate_context,
    validate_rubric,
)


def test_truncation_vector():
    text = "".join(chr(ord("a") + i % 26) for i in range(20_000))
    out = truncate_context(text)
    assert len(out) == 12_051
    assert out.startswith(text[:3000]) and out.endswith(text[-9000:])
    assert out[3000:3051] == "\n\n[... middle of parent trajectory truncated ...]\n\n"
    assert truncate_context(text[:12_000]) == text[:12_000]


def _item(name, w):
    return {"name": name, "weight": w, "description": f"{name} done", "score_0": 0, "score_full": "all"}


def test_rubric_weights_renormalised():
    rubric, err = validate_rubric({"rubric_items": [_item("a", 2), _item("b", 1), _item("c", 1)],
                                   "success_gate": "crafted", "failure_conditions": "none", "extra": 1})
    assert err == ""
    assert [i["weight"] for i in rubric["rubric_items"]] == [0.5, 0.25, 0.25]
    assert rubric["rubric_items"][0]["score_0"] == "0"
    assert rubric["failure_conditions"] == ["none"] and "extra" not in rubric
    assert validate_rubric({"rubric_items": [_item("a", 1), _item("b", 1)]})[0]["failure_conditions"] == [""]


@pytest.mark.parametrize("items, reason", [
    ([_item("a", 1)], "fewer than 2"),
    ([_item("a", -1), _item("b", 1)], "invalid weight"),
    ([_item("a", 0), _item("b", 0)], "sum to 0"),
    ([_item("a", float("nan")), _item("b", 1)], "invalid weight"),
    ([_item("a", 1), {"name": " ", "weight": 1, "description": "x"}], "non-empty name"),
    ([_item("a", 1), "text"], "not an object"),
])
def test_invalid_rubrics(items, reason):
    rubric, err = validate_rubric({"rubric_items": items})
    assert rubric is None and reason in err


def test_min_items_is_a_setting_and_no_maximum():
    items = [_item(str(i), 1) for i in range(12)]
    assert validate_rubric({"rubric_items": items})[0] is not None
    assert validate_rubric({"rubric_items": items[:3]}, min_items=4)[0] is None


def test_legacy_criteria_form():
    crit = [{"id": "x", "description": "d", "required_evidence": "e", "anchors": {"0": "", "0.5": "", "1": ""},
             "weight": 0.5}, {"id": "y", "description": "d", "required_evidence": "e",
                              "anchors": {"0": "", "0.5": "", "1": ""}, "weight": 0.5}]
    assert validate_rubric({"criteria": crit})[0] == {"criteria": crit}
    crit[1]["weight"] = 0.4
    assert validate_rubric({"criteria": crit})[0] is None


@pytest.mark.parametrize("text, expect", [
    ('{"success": false, "final_score": 0.3}', None),
    ('{"success": true, "final_score": 0}', None),
    ('{"final_score": 0.6}', (0.6, True)),
    ('Here:\n```json\n{"score": 1}\n```', (1.0, True)),
    ('{"final_score": 1.2}', None),
    ('{"final_score": NaN}', None),
    ('{"success": false, "final_score": 0}', (0.0, False)),
    ('{"final_score": "0.25"}', (0.25, True)),
    ('no json at all', None),
    ('{"final_score": [1]}', None),
])
def test_score_vectors(text, expect):
    score, err = parse_score(text)
    if expect is None:
        assert score is None and err
    else:
        assert (score.value, score.success) == expect


def test_json_extraction_order():
    assert extract_json_object('  {"a": 1} ') == {"a": 1}
    assert extract_json_object('x ```\n[1]\n``` ```json\n{"b": 2}\n``` y') == {"b": 2}
    assert extract_json_object('prefix {"c": {"d": 3}} suffix') == {"c": {"d": 3}}
    assert extract_json_object("[1, 2]") is None
    assert extract_json_object(None) is None
    assert extract_json_object("{" * 100_000) is None


def test_rubric_text_round_trip_and_prompts():
    ctx = RubricContext(parent_goal="Craft 1x iron_sword", metadata={"parent_depth": 0, "child_depth": 1},
                        parent_messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}],
                        parent_action="<python>await launch_subagent({'iron_ingot': 2})</python>",
                        environment_state={"inventory": {"iron_ore": 4, "é": 1}}, child_goal="Craft 2x iron_ingot")
    block = parent_context_block(ctx)
    assert block.index("[Parent Task]") < block.index("[Parent Trajectory Before Delegation]") < \
        block.index("[Delegated SubAgent Task]") < block.index("[Child Execution Budget]")
    assert "[Parent Message 1: user]\ngo" in block and '"é": 1' in block
    msgs = rubric_request(ctx)
    assert [m["role"] for m in msgs] == ["system", "user"] and "4 to 8 rubric_items" in msgs[1]["content"]
    text = "```json\n" + json.dumps({"rubric_items": [_item("a", 3), _item("b", 1)]}) + "\n```"
    rubric, err = parse_rubric(text)
    assert err == "" and rubric["rubric_items"][0]["weight"] == 0.75
    s = score_request(rubric, "Craft 2x iron_ingot", {"steps": []}, {"inventory": {}})
    payload = json.loads(s[1]["content"].split("\n\n")[1])
    assert payload["frozen_rubric"] == rubric and list(payload) == sorted(payload)
    # a huge trajectory is cut to 12,051 characters as a whole block
    long_ctx = RubricContext(**{**ctx.__dict__, "parent_messages": [{"role": "user", "content": "x" * 30_000}]})
    assert len(parent_context_block(long_ctx)) == 12_051
