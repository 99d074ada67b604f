"""A TextWorld-Sync oracle policy: replies, rubrics, scores and judge labels computed from what the prompt shows (the
TextWorld warm start's teacher, the twin of ``oracle.TextCraftOracle``).

``TextWorldOracle`` is a ``ScriptedGenerator`` script (``script(info, prompt_ids) -> reply text``). Run through the
real runtime (the shared world, concurrent sub-agents, the rubric coordinator, counterfactual branches, the
``policy_frozen`` judge's requests), it produces exactly the token streams the policy will see and write. It decides
from the prompt alone — the agent's task, the current observation and valid actions, its own last reply (compact
prompts, ``agents/textworld_prompt.py``) — plus one fact of the world's vocabulary a policy learns from its demos:
where an ingredient starts (the pantry's four, the kitchen for the rest; ``catalog.INGREDIENTS``).

An agent writes a plan and follows it, because a tiny model learns to copy far more easily than to cross-reference
its goal with the valid actions at every turn (a warm start taught to choose reactively sampled plausible but
ungrounded actions, 0 of 17 held-out tasks solved):

- its first acting turn writes the whole plan — for each dish, ingredient by ingredient in the order its task lists
  them, a walk when the ingredient starts in another room, ``take``, then each required cut or cook in the order the
  task names them, then ``prepare`` and ``eat`` the dish — one step a line after ``Plan:``, and acts its first step
  (``<action>a</action>``); every later turn copies the previous plan without its first step and acts the next one,
  until the plan is empty and the agent finishes. A plan made after other agents acted (the root's, once its
  sub-agents are back) starts from what the observation shows: ingredients on the counter are skipped, one in the
  shared inventory gets only the cuts and cooks its valid actions still offer, an eaten dish is skipped;
- the root opens a closed gate first (no agent then waits on it), and with probability ``delegate_prob`` (drawn once
  per tree) splits the task: one sub-agent per dish with ``<delegate>{"delegations": [...]}`` whose goal copies that
  dish's ingredient lines (``Prepare and eat dish_1: white onion (diced, grilled), salt (raw, uncut), …``); when its
  sub-agents return without having finished every dish, it plans what is left and does it (otherwise the world is
  solved and the root's loop ends). Without delegating, it plans every dish itself;
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
from typing import Any, Sequence

from envs_py.textworld_sync import catalog

_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_end\|>|<\|im_start\|>|\Z)", re.DOTALL)
_STRUCTURED = re.compile(r"Dish (dish_\d+): prepare the following ingredients:\n((?:- [^\n]*(?:\n|$))+)")
_COARSE = re.compile(r"Dish (dish_\d+) uses: ([^\n]*?)\.?$", re.MULTILINE)
_GOAL = re.compile(r"^Prepare and eat (dish_\d+): ([^\n]*?)\.?$", re.MULTILINE)
_INGREDIENT = re.compile(r"\s*([^,(]+?)(?: \(([^)]*)\))?(?:,|$)")
_PROGRESS = re.compile(r"- (dish_\d+): \d+/\d+ ingredients prepared, meal_prepared=(\w+), meal_eaten=(\w+)")
_PLAN = re.compile(r"Plan:\n((?:[^\n<]+\n)+)<action>")
_ROOM = re.compile(r"You are in the ([^\n]+)\.")
_COUNTER = re.compile(r"Shared prepared counter: ([^\n]*)")
_SECTION = re.compile(r"\[(Delegated SubAgent Task|Delegated Task|Goal)\]\n([^\n]*)")
PREP_VERBS = ("chop ", "slice ", "dice ", "mince ", "cook ")
VALID_HEADER = "# Valid Actions\n"


def messages(text: str) -> list[tuple[str, str]]:
    """Returns the (role, content) pairs of a decoded ChatML prompt (a cut last message included)."""
    return [(m.group(1), m.group(2)) for m in _MESSAGE.finditer(text)]


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


def home_room(name: str) -> str:
    """Returns the room an ingredient starts in (its first source location's room; the kitchen for others)."""
    entry = catalog.INGREDIENTS.get(name)
    room = entry[0][0].split(".", 1)[0] if entry else "kitchen"
    return room if room in catalog.SOURCE_ROOMS else "kitchen"


def prep_object(action: str) -> str | None:
    """Returns the ingredient a cut or cook command names (``dice X``, ``cook X on grill``), else None."""
    if not action.startswith(PREP_VERBS):
        return None
    rest = action.split(" ", 1)[1]
    if action.startswith("cook "):
        rest = re.sub(r" (?:in \w+|on \w+)$", "", rest)
    return rest


def eaten_dishes(text: str) -> dict[str, bool]:
    """Returns {dish id: eaten} from the last dish-progress lines of ``text``."""
    return {d: e == "True" for d, _, e in _PROGRESS.findall(text)}


def prepared_dishes(text: str) -> dict[str, bool]:
    """Returns {dish id: meal prepared} from the last dish-progress lines of ``text``."""
    return {d: p == "True" for d, p, _ in _PROGRESS.findall(text)}


def prep_commands(name: str, preps: Sequence[str]) -> list[str]:
    """Returns the cut and cook commands that give ``name`` its preparations, in the order they are named (raw and
    uncut need none): ``dice X``, ``cook X on grill``, …"""
    cuts, cooks = dict(catalog.CUTS), dict(catalog.COOKS)
    out = []
    for p in preps:
        if p in cuts:
            out.append(f"{cuts[p]} {name}")
        elif p in cooks:
            out.append(f"cook {name} {catalog.TOOL_PHRASE[cooks[p]]}")
    return out


def plan(specs: Sequence[tuple[str, str]], valid: Sequence[str], observation: str) -> list[str]:
    """Returns the actions that finish the dishes of ``specs`` from the state the observation and valid actions show
    (see the module docstring): per dish not yet eaten, per ingredient not yet on the counter, a walk to its room
    when needed, ``take``, its cuts and cooks (only those still offered when it is already in the shared inventory);
    then ``prepare`` (unless prepared) and ``eat``."""
    counter = _COUNTER.findall(observation)
    ready = {x.strip() for x in counter[-1].split(",")} if counter else set()
    room = (_ROOM.findall(observation) or ["kitchen"])[-1]
    eaten, prepared = eaten_dishes(observation), prepared_dishes(observation)
    held: dict[str, list[str]] = {}
    for a in valid:
        if prep_object(a) is not None:
            held.setdefault(prep_object(a), []).append(a)
    out: list[str] = []
    for dish, spec in specs:
        if eaten.get(dish):
            continue
        if not prepared.get(dish):
            for name, preps in ingredients(spec):
                if name in ready:
                    continue
                if name in held:
                    out += held[name]
                    continue
                target = home_room(name)
                if target != room:
                    out.append(f"go to {target}")
                    room = target
                out += [f"take {name}", *prep_commands(name, preps)]
            out.append(f"prepare {dish}")
        out.append(f"eat {dish}")
    return out


def plan_reply(actions: Sequence[str]) -> str:
    """Returns a reply that states the remaining plan, one step a line, and acts its first step. Each step stands at
    the start of a line, as in the valid-action list and in the action block, so it is the same tokens in all three:
    following the plan is copying."""
    return "Plan:\n" + "".join(f"{a}\n" for a in actions) + f"<action>{actions[0]}</action>"


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

    def __init__(self, tokenizer: Any, *, delegate_prob: float = 0.85, fail_prob: float = 0.25, seed: int = 0):
        self.tokenizer, self.delegate_prob, self.fail_prob, self.seed = tokenizer, delegate_prob, fail_prob, seed
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
        dishes = [d for d, _ in dish_specs(goal)]
        if kind == "rubric":
            return rubric_text(goal)
        state = text.split("[Final State]", 1)[-1].split("\n\n", 1)[0] if "[Final State]" in text else ""
        eaten = eaten_dishes(state)
        success = bool(dishes) and all(eaten.get(d) for d in dishes)
        return score_text(success) if kind == "score" else judge_text(success, dishes)

    def agent_reply(self, text: str, tree_id: str, node_id: str, depth: int, turn: int) -> str:
        """Returns an agent turn's reply from its decoded prompt (see the module docstring)."""
        msgs = messages(text)
        system = msgs[0][1] if msgs else ""
        first = next((c for r, c in msgs if r == "user"), "")
        last = next((c for r, c in reversed(msgs) if r == "user"), "")
        task = first.split("# Task\n", 1)[-1]
        specs = dish_specs(task)
        dishes = [d for d, _ in specs]
        block = last.split(VALID_HEADER, 1)[-1].split("\n\n", 1)[0] if VALID_HEADER in last else ""
        valid = [a for a in block.splitlines() if a.strip()]
        observation = last.split(VALID_HEADER, 1)[0]
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
        previous = next((c for r, c in reversed(msgs) if r == "assistant"), "")
        following = _PLAN.findall(previous)
        if following:  # copy the plan without the step just taken
            rest = following[-1].splitlines()[1:]
            return plan_reply(rest) if rest else finish_text(dishes)
        if "open door" in valid:
            return "<action>open door</action>"
        steps = plan(specs, valid, observation)
        return plan_reply(steps) if steps else finish_text(dishes)
