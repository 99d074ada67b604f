"""Tree records written by the recursive agent runtime and read by credit assignment (docs/design/algorithm.md §1.6, §4).

Everything a training signal is computed from lives here, as plain dataclasses that round-trip through JSONL
without loss (one tree per line; Python's ``json`` writes floats with ``repr``, so every float64 — logprobs,
rewards, NaN and ±inf included — reads back bit for bit). The records are environment-neutral: for TextWorld a
turn's ``code`` holds the reply text (the delegate block lives inside it) and ``output`` the observation.

Schema (field: type — meaning)

``Turn`` — one LLM call of one agent plus what its action produced (spec: a "step").
    index: int                    — position in the node's turn list (0-based)
    prompt_ids: list[int]         — the prompt token ids exactly as sent (after server-side truncation)
    completion_ids: list[int]     — the raw generated token ids (no ``</python>`` appended)
    logprobs: list[float]         — behaviour logprob of each completion token (len == len(completion_ids))
    policy_version: int           — the policy version that generated this completion
    completion_id: str | None     — None for synthetic turns (loop breaker): they produce no datum
    completion_text: str          — the decoded completion, special tokens kept (credit re-decodes the ids)
    thought: str, code: str       — the parsed action (TextCraft cell; TextWorld: the whole reply text)
    output: str, error: str       — observation / cell output and the error line ("" when none)
    reward: float                 — step reward
    reward_misc: dict             — the env checker's step record: "reward/success" (TextCraft: its verdict when the
                                    cell finished), "final_inventory", ... (older records also carry the rubric
                                    scorer's "reward/code_success", "reward/filter_success", "reward/rubric_score")
    misc: dict                    — anything else (usage, model name, prompt messages)

``RubricScore`` — the scorer's record of a rubric score applied to a sub-agent in the execution stage
(docs/design/algorithm.md §3.7); the reward it gives is ``Node.reward.rubric_score``.
    score: float, success: bool, original_binary_reward: float, rubric: dict | None, score_payload: dict | None

``Reward`` — what a node was graded, one value per provenance (None: that grader did not grade it). Each grader
writes its own field once; ``rl.rewards`` picks the one the method trains on. A rollout error zeroes them all when
read (``Node.rollout_error_zero_reward``), not when written.
    environment: float | None     — the environment's check (TextCraft: the checker's verdict when the finishing cell
                                    ran; a rubric-scored child: its label when it returned to the parent)
    judge: float | None           — the execution judge's label of a TextWorld sub-agent (RAO family), 1.0 / 0.0
    rubric_score: float | None    — the rubric score of a sub-agent (SERA family; the env value under the
                                    ``fallback_binary`` failure policy)

``Node`` — one agent (a "trajectory").
    id: str; goal: str; task_id: str; max_steps: int
    task_misc: dict               — target_items, initial_inventory, gold-plan keys, ...
    depth: int                    — root = 0 (as recorded; ``TreeIndex`` recomputes it from parent links)
    parent_id: str | None; fork_step: int | None  — the parent step whose code launched this node
    turns: list[Turn]
    finish_message: str | None; error_message: str | None
    env_labels: dict              — the environment's labels, e.g. {"success": 1.0, "reason": ...}
    reward: Reward                — the node's reward by provenance (older records: a float, read as below)
    rubric_score: RubricScore | None
    rollout_error_zero_reward: bool; skip_gradient_update: bool
    fork_group_id: str | None; branch_index: int | None  — set on counterfactual branch nodes
    misc: dict

``Branch`` — one counterfactual branch of a fork group (docs/design/algorithm.md §4 BranchResult).
    branch_index, trajectory_id, depth, reward, success (label; None = judge failed), score (policy score under
    the fresh rubric; None = invalid), initial_state, final_state, finish_message, error_message, selected

``ForkGroup`` — the B = 8 branches launched at one delegation in the rubric-generation stage.
    id, parent_id, fork_step, child_depth, goal, branches: list[Branch], skipped: bool,
    rubric_turn: Turn | None      — the freshly generated rubric request (prompt) and completion (trained in RT)
    rubric: dict | None           — the parsed rubric (None = invalid → group skipped)
    score_turns: list[Turn]       — the scorer calls (never trained)

``DelegationPoint`` — one ``launch_subagent`` call / delegate block as the runtime handled it.
    parent_id, fork_step, child_ids, goals, context, kind ("default" | "rubric" | "counterfactual" |
    "best_of_n" | "refused"), result (the string the parent got back), fork_group_id, misc

``Tree`` — one root rollout.
    id, task_id, root_id, nodes: dict[str, Node], stage: str | None, root_rollout_index: int | None,
    policy_version: int | None, fork_groups: list[ForkGroup], delegations: list[DelegationPoint],
    counterfactual_environment_count: int, misc: dict

Tree reconstruction (§1.6) is ``TreeIndex``: parent = ``parent_id`` if it is in the tree, else the node is a
root; depth = number of parent links to a root; children sorted by id; roots sorted; leaves = nodes without
children; descendant leaves of v = the leaves of v's subtree (v itself when v is a leaf).

Records written before ``Reward`` existed hold a float (or null) ``reward`` and keep the rest in the other fields;
``legacy_reward`` reads them as the credit code of that time did, so old tree files load and train the same.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "Turn", "RubricScore", "Reward", "legacy_reward", "Node", "Branch", "ForkGroup", "DelegationPoint", "Tree",
    "TreeIndex",
    "tree_to_dict", "tree_from_dict", "write_jsonl", "read_jsonl", "dumps_tree", "loads_tree",
]


@dataclasses.dataclass
class Turn:
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: int
    completion_id: str | None = None
    completion_text: str = ""
    thought: str = ""
    code: str = ""
    output: str = ""
    error: str = ""
    reward: float = 0.0
    reward_misc: dict[str, Any] = dataclasses.field(default_factory=dict)
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"turn {self.index}: {len(self.logprobs)} logprobs for "
                             f"{len(self.completion_ids)} completion tokens")


@dataclasses.dataclass
class RubricScore:
    score: float
    success: bool
    original_binary_reward: float = 0.0
    rubric: dict[str, Any] | None = None
    score_payload: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Reward:
    """A node's reward by provenance (see the module docstring): each grader writes its own field; a rubric score
    also re-reads ``environment`` from the child's label at its return."""

    environment: float | None = None
    judge: float | None = None
    rubric_score: float | None = None


@dataclasses.dataclass
class Node:
    id: str
    goal: str
    task_id: str = ""
    max_steps: int = 20
    task_misc: dict[str, Any] = dataclasses.field(default_factory=dict)
    depth: int = 0
    parent_id: str | None = None
    fork_step: int | None = None
    turns: list[Turn] = dataclasses.field(default_factory=list)
    finish_message: str | None = None
    error_message: str | None = None
    env_labels: dict[str, Any] = dataclasses.field(default_factory=dict)
    reward: Reward = dataclasses.field(default_factory=Reward)
    rubric_score: RubricScore | None = None
    rollout_error_zero_reward: bool = False
    skip_gradient_update: bool = False
    fork_group_id: str | None = None
    branch_index: int | None = None
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Branch:
    branch_index: int
    trajectory_id: str | None
    depth: int
    reward: float | None = None
    success: bool | None = None
    score: float | None = None
    initial_state: dict[str, Any] | None = None
    final_state: dict[str, Any] | None = None
    finish_message: str | None = None
    error_message: str | None = None
    selected: bool = False


@dataclasses.dataclass
class ForkGroup:
    id: str
    parent_id: str
    fork_step: int
    child_depth: int
    goal: str = ""
    branches: list[Branch] = dataclasses.field(default_factory=list)
    skipped: bool = False
    rubric_turn: Turn | None = None
    rubric: dict[str, Any] | None = None
    score_turns: list[Turn] = dataclasses.field(default_factory=list)
    num_branches: int = 8  # the branching factor the group was launched with (``method.branching_factor``)

    @property
    def complete(self) -> bool:
        """True iff not skipped, exactly ``num_branches`` branches (the paper's 8), and every branch has a trajectory
        id (docs/design/algorithm.md §4)."""
        return (not self.skipped and len(self.branches) == self.num_branches
                and all(b.trajectory_id for b in self.branches))


@dataclasses.dataclass
class DelegationPoint:
    parent_id: str
    fork_step: int
    child_ids: list[str] = dataclasses.field(default_factory=list)
    goals: list[str] = dataclasses.field(default_factory=list)
    context: str = ""
    kind: str = "default"
    result: str = ""
    fork_group_id: str | None = None
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Tree:
    id: str
    task_id: str
    root_id: str
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)
    stage: str | None = None
    root_rollout_index: int | None = None
    policy_version: int | None = None
    fork_groups: list[ForkGroup] = dataclasses.field(default_factory=list)
    delegations: list[DelegationPoint] = dataclasses.field(default_factory=list)
    counterfactual_environment_count: int = 1
    misc: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def root(self) -> Node:
        return self.nodes[self.root_id]


# ----------------------------------------------------------------------------------------------- reconstruction

@dataclasses.dataclass(frozen=True)
class TreeIndex:
    """Parent links, depths, children, roots and leaves of a tree, rebuilt from ``parent_id`` alone (§1.6)."""

    parent: dict[str, str | None]
    depth: dict[str, int]
    children: dict[str, list[str]]
    roots: list[str]
    leaves: list[str]

    @classmethod
    def build(cls, tree: Tree) -> "TreeIndex":
        """Returns the index of ``tree``; raises ValueError on a parent cycle."""
        ids = sorted(tree.nodes)
        parent = {i: (tree.nodes[i].parent_id if tree.nodes[i].parent_id in tree.nodes else None) for i in ids}
        children: dict[str, list[str]] = {i: [] for i in ids}
        for i in ids:
            if parent[i] is not None:
                children[parent[i]].append(i)  # ids iterate sorted, so children lists come out sorted
        depth: dict[str, int] = {}
        for i in ids:
            d, cur, seen = 0, i, {i}
            while parent[cur] is not None:
                cur = parent[cur]
                if cur in seen:
                    raise ValueError(f"parent cycle through node {cur}")
                seen.add(cur)
                d += 1
            depth[i] = d
        roots = [i for i in ids if parent[i] is None]
        leaves = [i for i in ids if not children[i]]
        return cls(parent=parent, depth=depth, children=children, roots=roots, leaves=leaves)

    @property
    def root(self) -> str:
        """Returns the single root id; raises ValueError when there is not exactly one (spec expects one)."""
        if len(self.roots) != 1:
            raise ValueError(f"expected exactly one root, found {len(self.roots)}")
        return self.roots[0]

    def descendant_leaves(self, node_id: str) -> list[str]:
        """Returns the sorted leaves of the subtree rooted at ``node_id`` (the node itself if it is a leaf)."""
        out, stack = [], [node_id]
        while stack:
            cur = stack.pop()
            kids = self.children[cur]
            if kids:
                stack.extend(kids)
            else:
                out.append(cur)
        return sorted(out)

    def subtree(self, node_id: str) -> list[str]:
        """Returns the sorted ids of ``node_id`` and all its descendants."""
        out, stack = [], [node_id]
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(self.children[cur])
        return sorted(out)


# ------------------------------------------------------------------------------------------------------ JSONL

def legacy_reward(node: Node, reward: float | None = None) -> Reward:
    """Returns the ``Reward`` of a node recorded before it carried one, from the fields that held it then:
    environment = the summed ``reward/code_success`` of its turns (the env value a rubric score kept), else the
    summed ``reward/success``, else ``env_labels["success"]``, else the old float ``reward`` (None when none is
    there); judge = ``env_labels["judge_success"]``; rubric_score = ``rubric_score.score``."""
    env = None
    for key in ("reward/code_success", "reward/success"):
        vals = [t.reward_misc[key] for t in node.turns if key in t.reward_misc]
        if vals:
            env = float(sum(vals))
            break
    if env is None and "success" in node.env_labels:
        env = float(node.env_labels["success"])
    if env is None and reward is not None:
        env = float(reward)
    judge = node.env_labels.get("judge_success")
    return Reward(environment=env, judge=None if judge is None else float(judge),
                  rubric_score=None if node.rubric_score is None else float(node.rubric_score.score))


def _from(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a record dataclass from its dict, converting the nested record fields."""
    kw = dict(data)
    if cls is Node:
        kw["turns"] = [_from(Turn, t) for t in kw.get("turns", [])]
        if kw.get("rubric_score") is not None:
            kw["rubric_score"] = _from(RubricScore, kw["rubric_score"])
        old = kw.pop("reward", None)
        if isinstance(old, dict):
            kw["reward"] = _from(Reward, old)
    elif cls is ForkGroup:
        kw["branches"] = [_from(Branch, b) for b in kw.get("branches", [])]
        kw["score_turns"] = [_from(Turn, t) for t in kw.get("score_turns", [])]
        if kw.get("rubric_turn") is not None:
            kw["rubric_turn"] = _from(Turn, kw["rubric_turn"])
    elif cls is Tree:
        kw["nodes"] = {k: _from(Node, v) for k, v in kw.get("nodes", {}).items()}
        kw["fork_groups"] = [_from(ForkGroup, g) for g in kw.get("fork_groups", [])]
        kw["delegations"] = [_from(DelegationPoint, d) for d in kw.get("delegations", [])]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(kw) - names
    if unknown:
        # Refuse rather than drop: silently losing a field would break the lossless guarantee.
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    obj = cls(**kw)
    if cls is Node and "reward" not in kw:  # written before Reward: read from the fields that held it then
        obj.reward = legacy_reward(obj, old)
    return obj


def tree_to_dict(tree: Tree) -> dict[str, Any]:
    """Returns a JSON-ready dict of the whole tree (nested records become dicts)."""
    return dataclasses.asdict(tree)


def tree_from_dict(data: dict[str, Any]) -> Tree:
    """Returns the Tree a ``tree_to_dict`` dict describes."""
    return _from(Tree, data)


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps_tree(tree: Tree) -> str:
    """Returns one JSONL line (no trailing newline) holding the tree, valid UTF-8 whatever its strings hold: a
    surrogate code point (a lone ``\\ud800`` a cell printed) is written as its JSON escape, which reads back as the
    same string (a pair of them as the character they encode)."""
    line = json.dumps(tree_to_dict(tree), ensure_ascii=False, sort_keys=True)
    if _SURROGATE.search(line) is None:
        return line
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", line)  # only ever inside a JSON string


def loads_tree(line: str) -> Tree:
    """Returns the Tree stored in one JSONL line."""
    return tree_from_dict(json.loads(line))


def write_jsonl(trees: Iterable[Tree], dest: str | Path | TextIO, *,
                on_error: Callable[[Tree, Exception], None] | None = None) -> int:
    """Writes one tree per line to a path (appending) or an open text stream; returns the number written.

    A string never fails (see :func:`dumps_tree`). A tree holding a value JSON cannot (TypeError, ValueError,
    RecursionError) raises, or, given ``on_error``, is passed to ``on_error(tree, exc)`` and left out, so the other
    trees are still written; no partial line is ever written."""
    if isinstance(dest, (str, Path)):
        with open(dest, "a", encoding="utf-8") as fh:
            return write_jsonl(trees, fh, on_error=on_error)
    n = 0
    for tree in trees:
        try:
            line = dumps_tree(tree)
        except (TypeError, ValueError, RecursionError) as e:
            if on_error is None:
                raise
            on_error(tree, e)
            continue
        dest.write(line + "\n")
        n += 1
    return n


def read_jsonl(src: str | Path | TextIO) -> Iterator[Tree]:
    """Yields the trees of a JSONL file (gzipped when its name ends in ``.gz``) or stream, skipping blank lines."""
    if isinstance(src, (str, Path)):
        with (gzip.open(src, "rt", encoding="utf-8") if str(src).endswith(".gz")
              else open(src, encoding="utf-8")) as fh:
            yield from read_jsonl(fh)
        return
    for line in src:
        if line.strip():
            yield loads_tree(line)
