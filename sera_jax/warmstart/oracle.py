"""A TextCraft oracle policy: gold plans rendered as agent replies, rubrics and scores (the warm start's teacher).

``TextCraftOracle`` is a ``ScriptedGenerator`` script (``script(info, prompt_ids) -> reply text``): run through the
real runtime (sandboxed cells, env workers, the rubric coordinator), it produces the conversations, rubric calls and
score calls that ``sera-warmstart`` imitates — token for token what the runtime sends and receives. It knows the
recipe book (it is the oracle) and reads only its goal from the prompt:

- an agent writes the plan as code in three cells. It copies its goal (item and count) into variables, looks the
  recipe up and prints it with the craftable ingredients; then, with probability ``delegate_prob``, it delegates
  every craftable ingredient in the amount the recipe needs (``await launch_subagent`` in a loop), otherwise it
  crafts the whole chain itself with a small recursive function; last, it crafts the target with the exact amounts
  and finishes. An agent's prompt does not show its depth, so a parent whose children are at the depth limit says
  so in the launch context, and a child told so crafts itself: the choice depends only on what the policy sees.
  The amounts are computed by the code from ``get_info`` (executions = ⌈count / result_count⌉), so what a model
  must get right is copying its goal and reproducing the program — the skill a tiny model can learn on a CPU;
- a sub-agent is *sabotaged* with probability ``fail_prob``: its final craft asks for one item more than the
  recipe yields (the craft fails) and it finishes anyway — so the scorer has failures to learn from; with
  probability ``exhaust_share`` a sabotaged sub-agent instead never crafts its target: it looks the recipe up again
  and again (numbered cells: the runtime ends a repeating loop early) until its step budget runs out — a long
  failure, as a sampled policy's mostly are, whose scoring prompt the §1.3 budget cuts;
- a rubric is a short JSON naming the delegated goal; a score is ``{"success": …, "final_score": …}`` from the
  child's true outcome (sabotaged ⇒ 0). With ``rubric_target_prob`` < 1 the rubric names the delegated goal only
  that often and otherwise a *distractor* — another craftable item of the recipe book, in the same amount — and a
  score judges the child against whatever its rubric's gate names (the gate is in the scoring prompt): a child
  scored against a distractor scores 0 whatever it did. So the warm start's rubrics are imperfect by construction
  and its scores follow them: ranking accuracy starts below 1, and only rubrics that name the real goal can raise
  it. With ``rubric_miss="vague"`` a missed rubric names no target at all (gate "task done") and every child
  scored against it gets the same 0.5: the scorer need not compare two names (a tiny model scores distractor
  rubrics' children 0 across the board, see docs/results/selfeval.md), and a vague rubric's fork group is all ties. The vague rubric
  is its own JSON; ``rubric_miss="generic"`` is the target rubric (its description still naming the goal) with
  its first item named "progress" and its gate "task done": the two things the scorer is shown change, the writer
  copies the goal either way, and its score is ``{"final_score": 0.5}`` with no success flag (the self-evaluation
  setting, ``configs/tiny_selfeval.yaml``; docs/results/selfeval/README.md lists the constructions the tiny model could not learn).
Randomness is a hash of (seed, tree, node): a tree replays exactly.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any, Sequence

from envs_py.textcraft.recipes import RecipeBook

_GOAL = re.compile(r"Your Goal: Craft the following items: ([^\n]*)")
_TARGET = re.compile(r"(\d+)x ([A-Za-z0-9_]+)")
_DELEGATED = re.compile(r"\[Delegated SubAgent Task\]\n([^\n]*)")
_FORK_SCORE = re.compile(r".*:fg\d+:(.+#b\d+)")
_SCORED_TASK = re.compile(r"\[Delegated Task\]\n([^\n]*)")
_GATE = re.compile(r"gate: ([^\n]*) crafted")


def reply(thought: str, code: str) -> str:
    """Returns a CodeAct reply: one thought and one python block."""
    return f"<thought>{thought}</thought>\n<python>{code}</python>"


def parse_targets(text: str) -> dict[str, int]:
    """Returns the targets of the first ``Your Goal: Craft the following items: …`` line of ``text`` ({} if none)."""
    m = _GOAL.search(text)
    if not m:
        return {}
    return {item: int(n) for n, item in _TARGET.findall(m.group(1).split("Context provided", 1)[0])}


def rubric_text(child_goal: str) -> str:
    """Returns the oracle's rubric for a delegation whose goal is ``child_goal``."""
    goal = child_goal.replace("Craft the following items: ", "")
    return json.dumps({
        "rubric_items": [
            {"name": "crafted", "weight": 0.8, "description": f"the shared inventory gains {goal}"},
            {"name": "finished", "weight": 0.2, "description": "calls finish after crafting"}],
        "success_gate": f"{goal} crafted",
        "failure_conditions": ["a craft fails", "finish before crafting"]})


def scored_node(call_name: str) -> str:
    """Returns the node id a scoring call grades: ``score:<child id>`` (execution stage) or
    ``score:<tree id>:fg<k>:<child id>#b<branch>`` (a fork group's branch, whose node id is ``<child id>#b<branch>``)."""
    subject = call_name.split(":", 1)[1]
    m = _FORK_SCORE.fullmatch(subject)
    return m.group(1) if m else subject


def goal_items(text: str) -> str:
    """Returns the ``<n>x <item>`` goals of a goal line, normalised (for comparing a rubric's gate with a task)."""
    return ", ".join(f"{n}x {item}" for n, item in _TARGET.findall(text))


def score_text(success: bool, value: float | None = None) -> str:
    """Returns the oracle's score of a child that did (or did not) complete its task (``value``: another score)."""
    return json.dumps({"success": success, "final_score": (1.0 if success else 0.0) if value is None else value})


VAGUE_GATE = "task done"
VAGUE_SCORE = 0.5
GENERIC_ITEM = "progress"  # rubric_miss="generic": the target rubric with its first item named this, gate VAGUE_GATE
RUBRIC_MISSES = ("distractor", "vague", "generic")


def vague_rubric_text() -> str:
    """Returns the oracle's vague rubric: it names no target, so the scores it leads to cannot tell children apart."""
    return json.dumps({
        "rubric_items": [{"name": "progress", "weight": 0.5, "description": "the sub-agent works on its task"},
                         {"name": "finished", "weight": 0.5, "description": "the sub-agent calls finish"}],
        "success_gate": VAGUE_GATE, "failure_conditions": ["no progress"]})


def generic_rubric_text(child_goal: str) -> str:
    """Returns the oracle's generic rubric for a delegation to ``child_goal``: the target rubric's JSON, its
    description still naming the goal, but its first item named "progress" and its gate "task done" — the two
    places the scorer sees (``[Rubric]`` shows item names and the gate) — so it checks no target."""
    rubric = json.loads(rubric_text(child_goal))
    rubric["rubric_items"][0]["name"] = GENERIC_ITEM
    rubric["success_gate"] = VAGUE_GATE
    return json.dumps(rubric)


class TextCraftOracle:
    """The oracle script (see the module docstring); ``sabotaged`` holds (tree id, node id) of failed children."""

    def __init__(self, book: RecipeBook, tokenizer: Any, *, max_depth: int = 2, delegate_prob: float = 0.85,
                 fail_prob: float = 0.25, exhaust_share: float = 0.0, rubric_target_prob: float = 1.0,
                 rubric_miss: str = "distractor", seed: int = 0):
        if rubric_miss not in RUBRIC_MISSES:
            raise ValueError(f"rubric_miss must be one of {RUBRIC_MISSES}, got {rubric_miss!r}")
        self.rubric_miss = rubric_miss
        self.book, self.tokenizer = book, tokenizer
        self.rubric_target_prob = rubric_target_prob
        self.rubrics = {"target": 0, **{m: 0 for m in RUBRIC_MISSES}}
        self.max_depth, self.delegate_prob, self.fail_prob, self.seed = max_depth, delegate_prob, fail_prob, seed
        self.exhaust_share = exhaust_share
        self.plans: dict[tuple[str, str], list[str]] = {}
        self.sabotaged: set[tuple[str, str]] = set()

    def _rng(self, *parts: str) -> random.Random:
        h = hashlib.blake2b("|".join((str(self.seed),) + parts).encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(h, "little"))

    def __call__(self, info: Any, prompt_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(prompt_ids))
        if info.node_id.startswith("rubric:"):
            m = _DELEGATED.search(text)
            goal = m.group(1) if m else ""
            if self.rubric_target_prob < 1 and goal and \
                    self._rng(info.tree_id, info.node_id, "rubric").random() >= self.rubric_target_prob:
                self.rubrics[self.rubric_miss] += 1
                if self.rubric_miss == "vague":
                    return vague_rubric_text()
                if self.rubric_miss == "generic":
                    return generic_rubric_text(goal)
                return rubric_text(self.distractor(goal, (info.tree_id, info.node_id)))
            self.rubrics["target"] += 1
            return rubric_text(goal)
        if info.node_id.startswith("score:"):
            done = (info.tree_id, scored_node(info.node_id)) not in self.sabotaged
            if self.rubric_miss == "vague" and f"gate: {VAGUE_GATE}" in text:
                return score_text(True, VAGUE_SCORE)  # the same for every child: nothing to rank by
            if self.rubric_miss == "generic" and f"{GENERIC_ITEM}, " in text and f"gate: {VAGUE_GATE}" in text:
                # The same 0.5 with no success flag (docs/design/algorithm.md §3.4: absent ⇒ success = score > 0). A tiny model taught
                # '"success": true' for every child of a generic rubric also wrote it over a failure's 0.0 under
                # a named one, which the parser rejects: 98% of probe fork groups lost their ranking that way.
                return json.dumps({"final_score": VAGUE_SCORE})
            return score_text(done and self.gate_names_task(text))
        key = (info.tree_id, info.node_id)
        if key not in self.plans:
            self.plans[key] = self.plan(parse_targets(text), info.depth, key)
        replies = self.plans[key]
        return replies[min(info.turn, len(replies) - 1)]

    def distractor(self, goal: str, key: tuple[str, str]) -> str:
        """Returns ``goal`` with its first item replaced by another craftable item of its tier (same amount): a
        plausible rubric target that is not the delegated one."""
        found = _TARGET.search(goal)
        if not found:
            return goal
        n, item = found.groups()
        tier = next((v for v in self.book.items_by_tier.values() if item in v), ())
        others = sorted(k for k in tier if k != item and self.book.can_craft(k)) or \
            sorted(k for k in self.book.recipes if k != item)
        other = self._rng(*key, "distractor").choice(others) if others else item
        return goal[:found.start()] + f"{n}x {other}" + goal[found.end():]

    def gate_names_task(self, score_prompt: str) -> bool:
        """Returns whether the rubric in a scoring prompt names the delegated task's goal (always, without
        distractors: the oracle's score is then the child's true outcome)."""
        if self.rubric_target_prob >= 1 or self.rubric_miss in ("vague", "generic"):
            return True
        task, gate = _SCORED_TASK.search(score_prompt), _GATE.search(score_prompt)
        if not (task and gate):
            raise ValueError("the oracle's distractor rubrics need the compact scoring prompt ([Delegated Task], "
                             "[Rubric] ... gate: ...); this scoring prompt has no such lines")
        return goal_items(task.group(1)) == goal_items(gate.group(1))

    def child_context(self, child_depth: int) -> str:
        """Returns the launch context a parent gives a child at ``child_depth`` (empty below the depth limit)."""
        return LIMIT_CONTEXT if child_depth >= self.max_depth else ""

    def plan(self, targets: dict[str, int], depth: int, key: tuple[str, str] = ("", "")) -> list[str]:
        """Returns the replies of an agent at ``depth`` whose goal is ``targets`` (its first target), turn by turn."""
        if not targets:
            return [reply("I have no target.", "finish('no target')")]
        rng = self._rng(*key)
        item, n = next(iter(targets.items()))
        replies = [reply("Read the goal and look up its recipe.", LOOKUP_CODE.replace("GOAL", f"{item!r}, {n}"))]
        craftable = [k for k in self.book.recipe(item).ingredients if self.book.can_craft(k)] \
            if self.book.recipe(item) is not None else []
        if craftable:
            # The choice may depend on the depth only through what the prompt shows: a parent whose children are at
            # the depth limit tells them so in the launch context (LIMIT_CONTEXT).
            if depth < self.max_depth and rng.random() < self.delegate_prob:
                code = DELEGATE_CODE.replace("CONTEXT", repr(self.child_context(depth + 1)))
                replies.append(reply("Delegate the craftable ingredients to sub-agents.", code))
            else:
                replies.append(reply("Craft the ingredients myself.", MAKE_CODE))
        sabotage = depth > 0 and rng.random() < self.fail_prob
        if sabotage:
            self.sabotaged.add(key)
            if rng.random() < self.exhaust_share:  # the last draw of a plan: exhaust_share 0 leaves plans as they were
                # distinct cells (the runtime ends a repeating loop early), more than any step budget
                return replies + [reply("Check the recipe again.", RECHECK_CODE.replace("I", str(i)))
                                  for i in range(1, 33)]
        replies.append(reply("Craft the target and finish.", FINAL_CODE.replace("OFFSET", " + 1" if sabotage else "")))
        return replies


# The agent's program: cell 1 (its goal, the recipe and the craftable ingredients, printed so that the next choice
# depends on what the agent has seen), cell 2 (delegating or crafting those ingredients), cell 3 (the target, then
# finish).
LOOKUP_CODE = """\
t, n = GOAL
r = get_info([t])[0]['recipes'][0]
c = [k for k in r['ingredients'] if not get_info([k])[0]['is_base']]
print(r, c)"""
LIMIT_CONTEXT = "craft it yourself"
DELEGATE_CODE = """\
e = -(-n // r['result_count'])
for k in c:
    print(await launch_subagent({k: r['ingredients'][k] * e}, CONTEXT))"""

MAKE_CODE = """\
def make(t, n):
    r = get_info([t])[0]['recipes'][0]
    e = -(-n // r['result_count'])
    for k, u in r['ingredients'].items():
        if not get_info([k])[0]['is_base']:
            make(k, u * e)
    print(craft({k: u * e for k, u in r['ingredients'].items()}, (t, e * r['result_count'])))
e = -(-n // r['result_count'])
for k in c:
    make(k, r['ingredients'][k] * e)"""

RECHECK_CODE = "print(I, get_info([t] + list(r['ingredients'])))"

FINAL_CODE = """\
e = -(-n // r['result_count'])
print(craft({k: u * e for k, u in r['ingredients'].items()}, (t, e * r['result_count']OFFSET)))
finish(f'Crafted {n}x {t}')"""
