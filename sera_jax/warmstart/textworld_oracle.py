"""A TextWorld-Sync oracle policy: replies, rubrics, scores and judge labels computed from what the prompt shows (the
TextWorld warm start's teacher, the twin of ``oracle.TextCraftOracle``).

``TextWorldOracle`` is a ``ScriptedGenerator`` script (``script(info, prompt_ids) -> reply text``). Run through the
real runtime (the shared world, concurrent sub-agents, the rubric coordinator, counterfactual branches, the
``policy_frozen`` judge's requests), it produces exactly the token streams the policy will see and write. It decides
from the prompt alone: the agent's task (its first message) and its last message (the current observation and
valid actions).

An agent acts reactively on what its last message shows, by a rule a tiny model can read off the prompt's last
lines (the valid-action list ends with the actions that make progress: ``take`` an ingredient, then the cuts and
cooks of what the shared inventory holds, then ``prepare`` and ``eat`` a dish):

- a closed gate is opened first (``open door``); otherwise, when the list's last action makes progress, it is the
  reply (``<action>cook red potato in oven</action>``); otherwise nothing is left to do in this room and the agent
  walks to the other one where ingredients start (the kitchen or the pantry). Every action the reference world rules
  offer is a required one, so greedy progress finishes every dish; a sub-agent helps with whatever is offered and
  finishes (``<finish>Prepared and ate dish_1.</finish>``) once its goal's dishes are eaten. (Two earlier teachers
  failed here: choosing among the valid actions by cross-referencing the goal at every turn, and writing the whole
  plan once and copying it on — a 0.9M-parameter warm start solved 0 of 17 and 0 of 152 held-out tasks with them:
  the plans it wrote from a goal were wrong, and the choices ungrounded);
- with ``child_rule="own_goal"`` (``warmstart.child_rule``) a sub-agent takes instead the last progress action on
  its own goal's ingredients or dishes, else walks (``own_goal_action``): two children on one world, prompted with
  the same observation, then never take the same action, and each eats its own dish within the default's 10 turns
  (under the greedy rule the world refuses ~44% of the children's turns and the root finishes their work);
- the root opens a closed gate first (no agent then waits on it), and with probability ``delegate_prob`` (drawn once
  per tree) splits the task: one sub-agent per dish with ``<delegate>{"delegations": [...]}`` whose goal copies that
  dish's ingredient lines (``Prepare and eat dish_1: white onion (diced, grilled), salt (raw, uncut), …``); when its
  sub-agents return without having finished every dish, it carries on by the same rule (otherwise the world is
  solved and the root's loop ends). Without delegating, it does every dish itself;
- a sub-agent is *sabotaged* with probability ``fail_prob``: after a random number (0-5) of correct turns it finishes
  with the message of a finished dish although its dish is not eaten — the failures the scorer and the judge must
  learn to score 0 (their prompts show the final dish progress and the replies);
- a rubric names the delegated dishes; a score is ``{"success": …, "final_score": …}`` and a judge label
  ``{"success": …, "reason": …}``, both true iff every dish of the goal is eaten in the final state the prompt shows.

Randomness is a hash of (seed, tree, node): a tree replays exactly.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from typing import Any

_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_end\|>|<\|im_start\|>|\Z)", re.DOTALL)
_STRUCTURED = re.compile(r"Dish (dish_\d+): prepare the following ingredients:\n((?:- [^\n]*(?:\n|$))+)")
_COARSE = re.compile(r"Dish (dish_\d+) uses: ([^\n]*?)\.?$", re.MULTILINE)
_GOAL = re.compile(r"^Prepare and eat (dish_\d+): ([^\n]*?)\.?$", re.MULTILINE)
_INGREDIENT = re.compile(r"\s*([^,(]+?)(?: \(([^)]*)\))?(?:,|$)")
_PROGRESS = re.compile(r"- (dish_\d+): \d+/\d+ ingredients prepared, meal_prepared=(\w+), meal_eaten=(\w+)")
_PROGRESS_LINE = re.compile(r"^- (dish_\d+): (\d+)/(\d+) ingredients prepared, meal_prepared=\w+, meal_eaten=\w+$",
                            re.MULTILINE)
_ROOM = re.compile(r"You are in the ([^\n]+)\.")
_SECTION = re.compile(r"\[(Delegated SubAgent Task|Delegated Task|Goal)\]\n([^\n]*)")
PREP_VERBS = ("chop ", "slice ", "dice ", "mince ", "cook ")
VALID_HEADER = "# Valid Actions\n"


def messages(text: str) -> list[tuple[str, str]]:
    """Returns the (role, content) pairs of a decoded ChatML prompt (a cut last message included)."""
    return [(m.group(1), m.group(2)) for m in _MESSAGE.finditer(text)]


def prompt_view(text: str) -> tuple[str, str, str, list[str]]:
    """Returns (system message, the agent's task, the current observation, the valid actions) of an agent turn's
    decoded prompt: the task closes its first user message, the observation and the valid-action list its last."""
    msgs = messages(text)
    system = msgs[0][1] if msgs else ""
    first = next((c for r, c in msgs if r == "user"), "")
    last = next((c for r, c in reversed(msgs) if r == "user"), "")
    block = last.split(VALID_HEADER, 1)[-1].split("\n\n", 1)[0] if VALID_HEADER in last else ""
    return (system, first.split("# Task\n", 1)[-1], last.split(VALID_HEADER, 1)[0],
            [a for a in block.splitlines() if a.strip()])


def dish_specs(task_text: str) -> list[tuple[str, str]]:
    """Returns [(dish id, "name (prep, prep), …")] of a task text (structured or coarse view) or of a sub-agent goal
    (``Prepare and eat dish_k: …``), in order."""
    found = [(d, ", ".join(ln[2:].strip() for ln in body.splitlines() if ln.startswith("- ")))
             for d, body in _STRUCTURED.findall(task_text)]
    found = found or [(d, body.strip()) for d, body in _COARSE.findall(task_text)]
    return found or [(d, body.strip()) for d, body in _GOAL.findall(task_text)]


def ingredients(spec: str) -> list[tuple[str, list[str]]]:
    """Returns [(name, [preparation, …])] of ``name (prep, prep), name, …`` (no preparations when none are named)."""
    return [(m.group(1).strip(), [p.strip() for p in (m.group(2) or "").split(",") if p.strip()])
            for m in _INGREDIENT.finditer(spec) if m.group(1).strip()]


def ingredient_names(spec: str) -> list[str]:
    """Returns the ingredient names of ``name (prep, prep), name, …``."""
    return [name for name, _ in ingredients(spec)]


def goal_text(dish_id: str, spec: str) -> str:
    """Returns a sub-agent's goal for one dish: ``Prepare and eat dish_k: <its ingredient lines>.``"""
    return f"Prepare and eat {dish_id}: {spec}."


def is_progress(action: str) -> bool:
    """Whether ``action`` moves a dish on: taking an ingredient, a cut or a cook, preparing or eating a dish."""
    return (action.startswith(("take ", "prepare ", "eat ", *PREP_VERBS)) and action != "take knife")


def next_action(valid: Sequence[str], observation: str) -> str:
    """Returns the greedy action (see the module docstring): ``open door`` while offered, else the last valid action
    when it makes progress, else a walk to the other room where ingredients start."""
    if "open door" in valid:
        return "open door"
    if valid and is_progress(valid[-1]):
        return valid[-1]
    room = (_ROOM.findall(observation) or ["kitchen"])[-1]
    return "go to kitchen" if room == "pantry" else "go to pantry"


def own_goal_action(valid: Sequence[str], observation: str, specs: Sequence[tuple[str, str]]) -> str:
    """Returns a sub-agent's action under the ``own_goal`` rule: ``open door`` while offered, else the last valid
    progress action on an ingredient of its goal's dishes (``specs``) or preparing or eating one of them, else a walk
    to the other room where ingredients start (as ``next_action``)."""
    if "open door" in valid:
        return "open door"
    names = {n for _, spec in specs for n in ingredient_names(spec)}
    meals = {f"{verb} {d}" for d, _ in specs for verb in ("prepare", "eat")}
    mine = [a for a in valid if is_progress(a) and (a in meals or any(f" {n} " in f" {a} " for n in names))]
    if mine:
        return mine[-1]
    return next_action([], observation)


def final_state_span(text: str) -> tuple[int, int] | None:
    """Returns the (start, end) of the dish-progress lines under a score or judge prompt's ``[Final State]``
    header, or None when the prompt has none."""
    head = text.find("[Final State]\n")
    if head < 0:
        return None
    start = head + len("[Final State]\n")
    end = text.find("\n\n", start)
    return start, (len(text) if end < 0 else end)


def goal_dishes(text: str) -> list[str]:
    """Returns the dish ids of a side call's goal (its last ``[Goal]`` / ``[Delegated Task]`` section)."""
    return [d for d, _ in dish_specs((_SECTION.findall(text) or [("", "")])[-1][1])]


def verdict(text: str) -> bool:
    """Whether a score or judge prompt's final state shows every dish of its goal (``goal_dishes``) eaten: the
    oracle's score and label, read off the state alone."""
    dishes = goal_dishes(text)
    span = final_state_span(text)
    eaten = eaten_dishes(text[span[0]:span[1]]) if span else {}
    return bool(dishes) and all(eaten.get(d) for d in dishes)


def flip_final_state(text: str, rng: random.Random) -> str | None:
    """Returns a score or judge prompt whose final state is rewritten so that its verdict is the other one, every
    other byte kept: a success's goal dishes (one of them, or all) left unfinished at a random point (some
    ingredients prepared, or all and the meal prepared but not eaten); a failure's goal dishes all prepared and
    eaten. The other dishes of the shared world (a sibling's) are set against the new verdict: all eaten beside an
    unfinished goal, unfinished beside an eaten one. None when the prompt has no final state or no goal dish in it.
    The verdict-flip demos pair every score and judge demo with its flip, so a scorer can only be right on both by
    reading its own goal's line: sabotaged children alone let a small model score by the trajectory's look (short,
    no ``eat``) instead, and it then scored every real failure (a child out of turns, or eating a sibling's dish) a
    success; flips that kept the siblings' lines taught it "some meal eaten" (26 of 31 wrong successes on the
    tight-limit run's children had a sibling's dish eaten)."""
    span, dishes = final_state_span(text), goal_dishes(text)
    if span is None or not dishes:
        return None
    state = text[span[0]:span[1]]
    present = [d for d in dishes if re.search(rf"^- {d}: ", state, re.MULTILINE)]
    if not present:
        return None
    success = verdict(text)
    spoil = set(present if rng.random() < 0.5 else [rng.choice(present)]) if success else set()

    def eaten(dish: str, total: int) -> str:
        return f"- {dish}: {total}/{total} ingredients prepared, meal_prepared=True, meal_eaten=True"

    def unfinished(dish: str, total: int) -> str:
        ready = rng.randrange(total + 1)
        prepared = ready == total and rng.random() < 0.5
        return f"- {dish}: {ready}/{total} ingredients prepared, meal_prepared={prepared}, meal_eaten=False"

    def line(m: re.Match) -> str:
        dish, total = m.group(1), int(m.group(3))
        if dish not in dishes:  # a sibling's dish: against the new verdict
            return eaten(dish, total) if success else unfinished(dish, total)
        if not success:
            return eaten(dish, total)
        return unfinished(dish, total) if dish in spoil else m.group(0)

    flipped = _PROGRESS_LINE.sub(line, state)
    out = text[:span[0]] + flipped + text[span[1]:]
    return out if verdict(out) != success else None


def eaten_dishes(text: str) -> dict[str, bool]:
    """Returns {dish id: eaten} from the last dish-progress lines of ``text``."""
    return {d: e == "True" for d, _, e in _PROGRESS.findall(text)}


def finish_text(dishes: Sequence[str]) -> str:
    """Returns the finish message of an agent whose dishes are eaten (a sabotaged one says it too)."""
    return f"<finish>Prepared and ate {', '.join(dishes)}.</finish>"


def rubric_text(goal: str) -> str:
    """Returns the oracle's rubric for a delegation whose goal is ``goal``."""
    dishes = ", ".join(d for d, _ in dish_specs(goal)) or "the goal"
    return json.dumps({
        "rubric_items": [
            {"name": "eaten", "weight": 0.8, "description": f"{dishes} prepared and eaten"},
            {"name": "finished", "weight": 0.2, "description": "finishes after eating"}],
        "success_gate": f"{dishes} eaten", "failure_conditions": [f"{dishes} not eaten"]})


def score_text(success: bool) -> str:
    """Returns the oracle's score of a child that did (or did not) complete its goal."""
    return json.dumps({"success": success, "final_score": 1.0 if success else 0.0})


def judge_text(success: bool, dishes: Sequence[str]) -> str:
    """Returns the oracle's judge label of a child whose goal's ``dishes`` were (or were not) all eaten."""
    names = ", ".join(dishes) or "the goal"
    return json.dumps({"success": success, "reason": f"{names} {'eaten' if success else 'not eaten'}"})


class TextWorldOracle:
    """The oracle script (see the module docstring); ``sabotaged`` holds (tree id, node id) of children that lied."""

    def __init__(self, tokenizer: Any, *, delegate_prob: float = 0.85, fail_prob: float = 0.25, seed: int = 0,
                 child_rule: str = "greedy"):
        if child_rule not in ("greedy", "own_goal"):
            raise ValueError(f"child_rule must be 'greedy' or 'own_goal', got {child_rule!r}")
        self.tokenizer, self.delegate_prob, self.fail_prob, self.seed = tokenizer, delegate_prob, fail_prob, seed
        self.child_rule = child_rule
        self.sabotaged: set[tuple[str, str]] = set()
        self.delegated: set[tuple[str, str]] = set()
        self.counts = {"rubric": 0, "score": 0, "judge": 0, "turns": 0}

    def _rng(self, *parts: str) -> random.Random:
        h = hashlib.blake2b("|".join((str(self.seed),) + parts).encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(h, "little"))

    def __call__(self, info: Any, prompt_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(prompt_ids))
        kind = info.node_id.split(":", 1)[0] if ":" in info.node_id else ""
        if kind in ("rubric", "score", "judge"):
            self.counts[kind] += 1
            return self.side_call(kind, text)
        self.counts["turns"] += 1
        return self.agent_reply(text, info.tree_id, info.node_id, info.depth, info.turn)

    def side_call(self, kind: str, text: str) -> str:
        """Returns the rubric, score or judge reply for a side call's decoded prompt."""
        goal = (_SECTION.findall(text) or [("", "")])[-1][1]
        if kind == "rubric":
            return rubric_text(goal)
        success = verdict(text)
        return score_text(success) if kind == "score" else judge_text(success, goal_dishes(text))

    def agent_reply(self, text: str, tree_id: str, node_id: str, depth: int, turn: int) -> str:
        """Returns an agent turn's reply from its decoded prompt (see the module docstring)."""
        system, task, observation, valid = prompt_view(text)
        specs = dish_specs(task)
        dishes = [d for d, _ in specs]
        key = (tree_id, node_id)
        rng = self._rng(tree_id, node_id)
        if depth == 0:
            delegates = "<delegate>" in system and len(specs) > 1 and rng.random() < self.delegate_prob
            if delegates and key not in self.delegated:
                if "open door" in valid:
                    return "<action>open door</action>"  # open the gate first, so no sub-agent waits on it
                self.delegated.add(key)
                goals = [{"goal": goal_text(d, s)} for d, s in specs]
                return f"<delegate>{json.dumps({'delegations': goals})}</delegate>"
        elif rng.random() < self.fail_prob and turn == rng.randrange(6):
            self.sabotaged.add(key)
            return finish_text(dishes)  # claims the dish although it is not eaten
        if depth > 0 and dishes and all(eaten_dishes(observation).get(d) for d in dishes):
            return finish_text(dishes)
        if depth > 0 and self.child_rule == "own_goal":
            return f"<action>{own_goal_action(valid, observation, specs)}</action>"
        return f"<action>{next_action(valid, observation)}</action>"
