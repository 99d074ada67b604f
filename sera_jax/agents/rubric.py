"""Rubrics written before delegating, and scores of a finished child under the frozen rubric (docs/design/algorithm.md §3).

Pure functions over plain data: building the rubric-writer and scorer requests (message lists), extracting JSON
from model text, validating and renormalising a rubric, and parsing a score with the gate rule. The calls
themselves (which policy, which temperature, when) live with the launchers; nothing here touches the model.

Everything the policy writes is untrusted: every parse returns ``(value, error)`` and never raises on bad text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Sequence

from sera_jax.agents.environments import DEFAULT_ENV, environment
from sera_jax.agents.environments.textcraft import CHILD_TOOLS_TEXT  # the reference's default list (any env)

CONTEXT_CHAR_LIMIT = 12_000
TRUNCATION_MARK = "\n\n[... middle of parent trajectory truncated ...]\n\n"
MAX_RUBRIC_ITEMS_ASKED = 8

RUBRIC_SYSTEM = (
    "You are the parent agent. Before a sub-agent you are delegating to starts, you write the rubric that will "
    "later be used to score its completed trajectory with a number in [0, 1]. You can see your own task, what "
    "you did before this delegation, and the task you are handing over. The rubric must capture what you need "
    "from the sub-agent: that it completes the delegated task, returns results you can use, fabricates nothing "
    "and does no unnecessary or harmful work. Do not judge any particular future attempt and do not assume "
    "labels you cannot see. Reply with a single JSON object and nothing else: no markdown.")

RUBRIC_SCHEMA = {
    "rubric_items": [{"name": "string", "weight": "non-negative number", "description": "string",
                      "score_0": "what earns 0 on this item", "score_full": "what earns full credit"}],
    "success_gate": "string: the condition without which the whole score is 0",
    "failure_conditions": ["string"],
    "scoring_procedure": "string",
}

SCORE_SYSTEM = (
    "You grade one completed sub-agent trajectory against a frozen rubric. Use only the evidence in the "
    "trajectory and in the final environment state. A trajectory that does not complete its delegated task must "
    "receive exactly 0.0. Reply with a single JSON object and nothing else.")

SCORE_SCHEMA = {
    "success": "boolean",
    "criterion_scores": [{"name": "string", "score": "number in [0, 1]", "reason": "string"}],
    "final_score": "number in [0, 1]",
    "reason": "string",
}


def dumps(obj: Any) -> str:
    """Returns the JSON rendering used in every prompt: sorted keys, non-ASCII kept, default separators."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def truncate_context(text: str, limit: int = CONTEXT_CHAR_LIMIT) -> str:
    """Returns ``text`` if it fits ``limit`` characters, else its first limit//4 and last 3·limit//4 characters
    joined by the truncation mark (12,000 → 3,000 + 51 + 9,000 = 12,051 characters)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return text[:head] + TRUNCATION_MARK + text[len(text) - (limit - head):]


def render_messages(messages: Sequence[dict[str, Any]]) -> str:
    """Returns the parent's messages as ``[Parent Message i: role]`` lines followed by their content."""
    parts = []
    for i, m in enumerate(messages):
        content = m.get("content", "")
        parts.append(f"[Parent Message {i}: {m.get('role', '')}]\n"
                     f"{content if isinstance(content, str) else dumps(content)}")
    return "\n".join(parts)


@dataclasses.dataclass(frozen=True)
class RubricContext:
    """What the rubric writer sees at a delegation point (docs/design/algorithm.md §3.1)."""

    parent_goal: str
    metadata: dict[str, Any]
    parent_messages: Sequence[dict[str, Any]]
    parent_action: str
    environment_state: dict[str, Any]
    child_goal: str
    child_tools: str = CHILD_TOOLS_TEXT
    child_budget: int = 20


def parent_context_block(ctx: RubricContext) -> str:
    """Returns the parent context block (all sections), truncated to 12,000 characters as a whole."""
    sections = [
        "[Parent Task]\n" + ctx.parent_goal,
        "[Parent Metadata Visible To Rubric Generator]\n" + dumps(ctx.metadata),
        "[Parent Trajectory Before Delegation]\n" + render_messages(ctx.parent_messages),
        "[Parent Step: Delegation Decision]\n"
        "The observation of this action is hidden: it happens only after the sub-agent returns.\n"
        + ctx.parent_action,
        "[Observable Pre-call Environment]\n" + dumps(ctx.environment_state),
        "[Delegated SubAgent Task]\n" + ctx.child_goal,
        "[Child Tools]\n" + dumps(ctx.child_tools),
        "[Child Execution Budget]\n" + dumps(ctx.child_budget),
    ]
    return truncate_context("\n\n".join(sections))


COMPACT_RUBRIC_SYSTEM = ("Before a sub-agent starts, write the rubric that will score its trajectory in [0, 1]. "
                         "Reply with one JSON object.")
COMPACT_RUBRIC_FORMAT = ('{"rubric_items": [{"name", "weight", "description"}, ...], "success_gate", '
                         '"failure_conditions"}')
COMPACT_SCORE_SYSTEM = ("Score the sub-agent's trajectory under the frozen rubric. Reply with one JSON object: "
                        '{"success": true|false, "final_score": 0.0 if not success}.')


def compact_rubric_request(ctx: RubricContext, min_items: int = 2) -> list[dict[str, str]]:
    """Returns the rubric-writer messages in the compact style: the parent's task, its delegating action, the
    delegated task and budget, and the reply format, without the parent's conversation (it is the same few lines
    for every delegation of a tiny model's tree)."""
    user = "\n\n".join([
        "[Parent Task]\n" + ctx.parent_goal,
        "[Delegation]\n" + ctx.parent_action.strip(),
        "[Delegated SubAgent Task]\n" + ctx.child_goal,
        f"[Format] at least {min_items} rubric_items\n" + COMPACT_RUBRIC_FORMAT,
    ])
    return [{"role": "system", "content": COMPACT_RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def compact_score_request(rubric: dict[str, Any], delegated_task: str, trajectory: dict[str, Any],
                          final_state: dict[str, Any]) -> list[dict[str, str]]:
    """Returns the scoring messages in the compact style: the delegated task, the rubric's item names and gate,
    the child's code and outputs, its finish message and the final state."""
    steps = "\n".join(f"[{s['step']}] {s['code'].strip()}\n-> {s['output'].strip()} {s['error'].strip()}".rstrip()
                      for s in trajectory.get("steps", []))
    items = ", ".join(str(i.get("name", "")) for i in rubric.get("rubric_items", []))
    user = "\n\n".join([
        "[Delegated Task]\n" + delegated_task,
        f"[Rubric]\n{items}; gate: {rubric.get('success_gate', '')}",
        "[Trajectory]\n" + (steps or "(no steps)"),
        f"[Finish]\n{trajectory.get('finish_message')}\n[Error]\n{trajectory.get('error_message')}",
        "[Final State]\n" + dumps(final_state),
    ])
    return [{"role": "system", "content": COMPACT_SCORE_SYSTEM}, {"role": "user", "content": user}]


COMPACT_STEP_CHARS = 120       # a TextWorld reply shown to a compact scorer or judge (the policy's text: untrusted)
COMPACT_TRAJECTORY_CHARS = 2000  # all of them (head and tail kept), so the request fits a tiny model's context


def textworld_dish_lines(state: Any) -> str:
    """Returns a TextWorld object tree's dishes as the observation's dish-progress lines (``- dish_1: 2/3
    ingredients prepared, meal_prepared=False, meal_eaten=False``), or ``(unknown)`` when ``state`` has none."""
    dishes = state.get("dishes") if isinstance(state, dict) else None
    if not isinstance(dishes, dict) or not dishes:
        return "(unknown)"
    lines = []
    for dish_id, d in dishes.items():
        d = d if isinstance(d, dict) else {}
        ings = d.get("ingredients") if isinstance(d.get("ingredients"), dict) else {}
        ready = sum(1 for i in ings.values() if isinstance(i, dict) and i.get("ready"))
        lines.append(f"- {dish_id}: {ready}/{len(ings)} ingredients prepared, "
                     f"meal_prepared={bool(d.get('meal_prepared'))}, meal_eaten={bool(d.get('meal_eaten'))}")
    return "\n".join(lines)


def compact_replies(steps: Sequence[dict[str, Any]]) -> str:
    """Returns a TextWorld child's replies one a line (each cut to its last ``COMPACT_STEP_CHARS``: the block comes
    last; the whole cut to ``COMPACT_TRAJECTORY_CHARS``, head and tail kept): what a compact scorer or judge is shown
    of its steps, the final state standing for the observations."""
    lines = [" ".join(str(s.get("code", "")).split())[-COMPACT_STEP_CHARS:] for s in steps]
    return truncate_context("\n".join(lines) or "(no steps)", COMPACT_TRAJECTORY_CHARS)


def compact_textworld_score_request(rubric: dict[str, Any], delegated_task: str, trajectory: dict[str, Any],
                                    final_state: dict[str, Any]) -> list[dict[str, str]]:
    """Returns the compact scoring messages of a TextWorld child: the delegated task, the rubric's item names and
    gate, the final dish progress (the world's object tree rendered as observation lines), the finish message and
    the child's replies."""
    items = ", ".join(str(i.get("name", "")) for i in rubric.get("rubric_items", []))
    user = "\n\n".join([
        "[Delegated Task]\n" + delegated_task,
        f"[Rubric]\n{items}; gate: {rubric.get('success_gate', '')}",
        "[Final State]\n" + textworld_dish_lines(final_state),
        f"[Finish]\n{trajectory.get('finish_message')}",
        "[Trajectory]\n" + compact_replies(trajectory.get("steps", [])),
    ])
    return [{"role": "system", "content": COMPACT_SCORE_SYSTEM}, {"role": "user", "content": user}]


def rubric_request(ctx: RubricContext, min_items: int = 2, style: str = "paper") -> list[dict[str, str]]:
    """Returns the two messages (system, user) of the rubric-writer call (``style`` "compact": see
    ``compact_rubric_request``)."""
    if style == "compact":
        return compact_rubric_request(ctx, min_items)
    low = max(4, min_items)
    user = "\n\n".join([
        "Generate a scoring rubric for the delegated SubAgent task.",
        parent_context_block(ctx),
        "Output schema:\n" + dumps(RUBRIC_SCHEMA),
        "Constraints:\n"
        f"- Include {low} to {MAX_RUBRIC_ITEMS_ASKED} rubric_items.\n"
        "- Weights are non-negative and sum to about 1.\n"
        "- The success gate is strict: a sub-agent that does not complete the delegated task gets 0.\n"
        "- Make the rubric specific to the delegated task and to the parent context.",
    ])
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def score_request(rubric: dict[str, Any], delegated_task: str, trajectory: dict[str, Any],
                  final_state: dict[str, Any], style: str = "paper", env: str = DEFAULT_ENV) -> list[dict[str, str]]:
    """Returns the two messages of the scoring call: the frozen rubric, the child's own steps, the final state
    (``style`` "compact": the environment's ``compact_score_request``, e.g. ``compact_score_request`` for TextCraft,
    ``compact_textworld_score_request`` for TextWorld)."""
    if style == "compact":
        return environment(env).get("compact_score_request")(rubric, delegated_task, trajectory, final_state)
    payload = {"delegated_task": delegated_task, "final_environment_state": final_state,
               "frozen_rubric": rubric, "trajectory": trajectory}
    user = "\n\n".join([
        "Score this completed SubAgent trajectory using the frozen rubric.",
        dumps(payload),
        "Output schema:\n" + dumps(SCORE_SCHEMA),
        "Hard rule: if success is false, final_score must be exactly 0.0; if success is true, final_score must be "
        "greater than 0 and at most 1.",
    ])
    return [{"role": "system", "content": SCORE_SYSTEM}, {"role": "user", "content": user}]


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """Returns the first JSON object among: the stripped text, each fenced block, the first-'{'-to-last-'}'
    substring; None when none decodes to an object."""
    if not isinstance(text, str):
        return None
    candidates = [text.strip()] + [m.strip() for m in _FENCE.findall(text)]
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        candidates.append(text[first:last + 1])
    for c in candidates:
        try:
            obj = json.loads(c)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _weight(value: Any) -> float | None:
    try:
        w = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return w if math.isfinite(w) and w >= 0 else None


def validate_rubric(obj: Any, min_items: int = 2) -> tuple[dict[str, Any] | None, str]:
    """Returns (normalised rubric, "") or (None, reason) per docs/design/algorithm.md §3.2 (weights renormalised to sum 1)."""
    if not isinstance(obj, dict):
        return None, "rubric is not a JSON object"
    items = obj.get("rubric_items")
    if items is None and "criteria" in obj:
        return _validate_legacy(obj)
    if not isinstance(items, list):
        return None, "rubric_items is missing or not a list"
    if len(items) < min_items:
        return None, f"rubric has {len(items)} items, fewer than {min_items}"
    clean, total = [], 0.0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return None, f"rubric item {i} is not an object"
        name, desc = item.get("name"), item.get("description")
        if not isinstance(name, str) or not name.strip() or not isinstance(desc, str) or not desc.strip():
            return None, f"rubric item {i} lacks a non-empty name or description"
        w = _weight(item.get("weight", 0.0))
        if w is None:
            return None, f"rubric item {i} has an invalid weight {item.get('weight')!r}"
        total += w
        clean.append({"name": name, "weight": w, "description": desc,
                      "score_0": str(item.get("score_0", "")), "score_full": str(item.get("score_full", ""))})
    if total <= 0:
        return None, "rubric weights sum to 0"
    for item in clean:
        item["weight"] = item["weight"] / total
    failures = obj.get("failure_conditions")
    failures = [str(f) for f in failures] if isinstance(failures, list) else [str(failures or "")]
    return {"rubric_items": clean, "success_gate": str(obj.get("success_gate", "") or ""),
            "failure_conditions": failures, "scoring_procedure": str(obj.get("scoring_procedure", "") or "")}, ""


def _validate_legacy(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    criteria = obj.get("criteria")
    if not isinstance(criteria, list) or not criteria:
        return None, "criteria is not a non-empty list"
    ids, total = set(), 0.0
    for i, c in enumerate(criteria):
        if not isinstance(c, dict):
            return None, f"criterion {i} is not an object"
        cid = c.get("id")
        if not isinstance(cid, str) or not cid.strip() or cid in ids:
            return None, f"criterion {i} has a missing or duplicate id"
        ids.add(cid)
        for key in ("description", "required_evidence"):
            if not isinstance(c.get(key), str) or not c[key].strip():
                return None, f"criterion {i} lacks {key}"
        anchors = c.get("anchors")
        if not isinstance(anchors, dict) or not {"0", "0.5", "1"} <= set(anchors):
            return None, f"criterion {i} lacks anchors 0 / 0.5 / 1"
        w = _weight(c.get("weight"))
        if w is None:
            return None, f"criterion {i} has an invalid weight"
        total += w
    if abs(total - 1.0) > 1e-4:
        return None, f"criteria weights sum to {total}, not 1"
    return obj, ""


def parse_rubric(text: str, min_items: int = 2) -> tuple[dict[str, Any] | None, str]:
    """Returns (rubric, "") from model text, or (None, why it is invalid)."""
    obj = extract_json_object(text)
    if obj is None:
        return None, "no JSON object in the rubric text"
    return validate_rubric(obj, min_items)


@dataclasses.dataclass(frozen=True)
class Score:
    value: float
    success: bool
    payload: dict[str, Any]


def parse_score(text: str) -> tuple[Score | None, str]:
    """Returns (Score, "") or (None, reason) per docs/design/algorithm.md §3.4: value = final_score (else score) in [0, 1];
    success false ⇒ value must be 0; success true ⇒ value > 0; absent ⇒ success = value > 0."""
    obj = extract_json_object(text)
    if obj is None:
        return None, "no JSON object in the score text"
    raw = obj.get("final_score", obj.get("score"))
    if raw is None:
        return None, "no final_score or score"
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None, f"score {raw!r} is not a number"
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, f"score {value} is outside [0, 1]"
    success = obj.get("success")
    if success is False and value != 0.0:
        return None, "success is false but the score is not 0"
    if success is True and value <= 0.0:
        return None, "success is true but the score is 0"
    flag = success if isinstance(success, bool) else value > 0.0
    return Score(value=value, success=flag, payload=obj), ""


def child_trajectory_view(goal: str, steps: Sequence[dict[str, Any]], finish_message: str | None,
                          error_message: str | None) -> dict[str, Any]:
    """Returns the child's own steps as the scorer sees them (TextCraft serialisation of docs/design/algorithm.md §3.3)."""
    return {
        "task_goal": goal,
        "steps": [{"step": i, "thought": s.get("thought", ""), "code": s.get("code", ""),
                   "output": s.get("output", ""), "error": s.get("error", "")} for i, s in enumerate(steps)],
        "finish_message": finish_message,
        "error_message": error_message,
    }
