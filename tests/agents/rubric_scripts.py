"""Canned texts for the rubric-stage tests: rubrics, scores, and agent replies of both environments."""

from __future__ import annotations

import json


def py(code: str) -> str:
    return f"<thought>t</thought>\n<python>{code}</python>"


def item(name: str, w, desc: str = "done") -> dict:
    return {"name": name, "weight": w, "description": desc, "score_0": "no", "score_full": "yes"}


def rubric_text(*weights, marker: str = "RUBRICMARK") -> str:
    """A short valid rubric (the marker lets tests look for rubric text where it must never appear)."""
    items = [item(f"c{i}", w, marker if i == 0 else "ok") for i, w in enumerate(weights or (2, 1))]
    return json.dumps({"rubric_items": items, "success_gate": "made", "failure_conditions": ["none"],
                       "scoring_procedure": "sum"})


def score_text(value, success=None) -> str:
    obj = {"final_score": value, "reason": "r"}
    if success is not None:
        obj["success"] = success
    return json.dumps(obj)


# Every malformed rubric of docs/design/algorithm.md §3.2 (with min_items = 2).
BAD_RUBRICS = {
    "no_json": "I would grade on quality.",
    "one_item": json.dumps({"rubric_items": [item("a", 1)]}),
    "negative_weight": json.dumps({"rubric_items": [item("a", -1), item("b", 1)]}),
    "zero_weights": json.dumps({"rubric_items": [item("a", 0), item("b", 0)]}),
    "nan_weight": '{"rubric_items": [{"name": "a", "weight": NaN, "description": "d"}, '
                  '{"name": "b", "weight": 1, "description": "d"}]}',
    "empty_name": json.dumps({"rubric_items": [item(" ", 1), item("b", 1)]}),
    "empty_description": json.dumps({"rubric_items": [item("a", 1, " "), item("b", 1)]}),
    "item_not_object": json.dumps({"rubric_items": ["a", item("b", 1)]}),
    "items_not_list": json.dumps({"rubric_items": "a, b"}),
    "bad_legacy": json.dumps({"criteria": [{"id": "x", "weight": 0.5}]}),
}

# Every malformed score of docs/design/algorithm.md §3.4.
BAD_SCORES = {
    "false_but_positive": score_text(0.3, False),
    "true_but_zero": score_text(0, True),
    "above_one": score_text(1.2),
    "nan": '{"final_score": NaN}',
    "negative": score_text(-0.1),
    "no_json": "Looks good to me, 8/10.",
    "no_value": json.dumps({"success": True, "reason": "r"}),
    "not_a_number": json.dumps({"final_score": "high"}),
}

TW_CHILD = "root/subagent-0-0"
TW_ROOT = ['<delegate>{"goal": "take the white onion"}</delegate>', "<finish>done</finish>"]
TW_CHILD_REPLIES = ["<action>take white onion</action>", "<finish>took it</finish>"]

TC_CHILD = "root/subagent-1-0"
TC_ROOT = [py("print(view_inventory())"), py("r = await launch_subagent({'o3_i1': 4})\nprint(r)"),
           py("print(view_inventory())\nfinish('ok')")]
TC_CHILD_OK = [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made')")]
TC_CHILD_BAD = [py("finish('gave up')")]
