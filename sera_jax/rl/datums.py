"""Trees → training datums, one function per objective (docs/design/algorithm.md §2).

A datum is one training sequence: tokens (prompt and completion), a 0/1 loss mask on the tokens to be predicted,
the behaviour logprob and policy version of every token (0.0 / −1 on prompt tokens), and its credit in three fields,
each written by one step of the pipeline: ``reward`` (here), ``advantage`` (``baselines``: the reward less its
baseline, possibly re-based or sign-flipped at step scope) and ``weight`` (``baselines.apply_depth_weights``; 1
otherwise). ``batch`` trains every masked token on advantage × weight, clipped. The mask is per *token* (token t is
trained when mask[t] = 1); ``batch`` shifts it for next-token prediction. Scorer completions are never turned into
datums.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.records import Tree, TreeIndex, Turn
from sera_jax.rl import rewards as R
from sera_jax.rl.launch_spans import launch_token_mask

__all__ = ["Datum", "execution_datums", "delegation_datums", "rubric_datums", "merge_turns"]

OBJECTIVES = ("execution", "delegation", "rubric_generation")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Datum:
    tokens: tuple[int, ...]
    mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    reward: float
    objective: str
    traj_depth: int
    traj_start: int
    tree_id: str = ""
    task_id: str = ""
    node_id: str = ""
    rollout_index: int = 0
    group_id: str = ""          # rubric stage: the fork group; otherwise the node
    trainable: bool = True
    advantage: float | None = None  # None until a baseline sets it: packing refuses such a datum
    weight: float = 1.0             # the depth weight (docs/design/algorithm.md §5.5)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.mask) == len(self.logprobs) == len(self.versions) == n):
            raise ValueError("datum arrays differ in length")

    @property
    def num_trained(self) -> int:
        """Returns the number of loss-masked tokens."""
        return sum(self.mask)


def _datum(prompt: Sequence[int], turn: Turn, cmask: Sequence[int], **kw: Any) -> Datum:
    n = len(prompt)
    return Datum(tokens=tuple(prompt) + tuple(turn.completion_ids), mask=(0,) * n + tuple(cmask),
                 logprobs=(0.0,) * n + tuple(float(x) for x in turn.logprobs),
                 versions=(-1,) * n + (int(turn.policy_version),) * len(turn.completion_ids), **kw)


def merge_turns(turns: Sequence[Turn]) -> list[tuple[list[int], list[int], list[float], list[int]]]:
    """Returns the prefix-merged sequences (tokens, mask, logprobs, versions) of consecutive turns (§2.1): a turn
    whose prompt extends the accumulated tokens appends only the new prompt suffix (mask 0) and its completion
    (mask 1); any other prompt (truncation, re-templating) flushes and starts a new sequence."""
    out, acc = [], None
    for t in turns:
        p, c = list(t.prompt_ids), list(t.completion_ids)
        if acc is not None and len(acc[0]) <= len(p) and p[:len(acc[0])] == acc[0]:
            new = p[len(acc[0]):]
        else:
            if acc is not None:
                out.append(acc)
            acc, new = ([], [], [], []), p
        acc[0].extend(new + c)
        acc[1].extend([0] * len(new) + [1] * len(c))
        acc[2].extend([0.0] * len(new) + [float(x) for x in t.logprobs])
        acc[3].extend([-1] * len(new) + [int(t.policy_version)] * len(c))
    if acc is not None:
        out.append(acc)
    return out


def _ordered(tree: Tree) -> tuple[TreeIndex, list[str]]:
    idx = TreeIndex.build(tree)
    return idx, sorted(tree.nodes, key=lambda i: (idx.depth[i], i))


def execution_datums(tree: Tree, *, mode: str = "rubric", filter_errors: bool = True,
                     env: EnvName | None = None) -> list[Datum]:
    """Returns the execution datums of every trainable trajectory of one rollout, each carrying its trajectory's
    reward (root: env success; sub-agent: rubric score, or for ``mode="rao"`` its env success in TextCraft and the
    execution judge's label in TextWorld — see ``rewards.execution_reward``). ``env`` defaults to the tree's
    recorded ``misc["env"]`` (TextCraft when it has none).

    Skipped: ``skip_gradient_update`` trajectories (a TextWorld sub-agent whose judge call failed among them),
    TextWorld RAO sub-agents without a label, turns without a completion id, and — with ``filter_errors``
    (TextCraft) on a trajectory whose filter success is ≥ 1 — turns with an error or a traceback in the output.
    """
    env = env or tree.misc.get("env") or DEFAULT_ENV
    idx, order = _ordered(tree)
    out: list[Datum] = []
    for nid in order:
        node = tree.nodes[nid]
        reward = R.execution_reward(node, is_root=idx.parent[nid] is None, mode=mode, env=env)
        if reward is None:
            continue
        drop_errors = filter_errors and R.filter_success(node) >= 1.0
        turns = [t for t in node.turns if t.completion_id is not None and not (
            drop_errors and (t.error or "traceback" in t.output.lower()))]
        for k, (toks, mask, lps, vers) in enumerate(merge_turns(turns)):
            out.append(Datum(tokens=tuple(toks), mask=tuple(mask), logprobs=tuple(lps), versions=tuple(vers),
                             reward=reward, objective="execution", traj_depth=idx.depth[nid], traj_start=int(k == 0),
                             tree_id=tree.id, task_id=tree.task_id, node_id=nid,
                             rollout_index=tree.root_rollout_index or 0, group_id=nid))
    return out


def _truncate_after_last(d: Datum) -> Datum:
    # The advantage sits on the final position in the reference trainer; cutting after the last trained token
    # keeps it (docs/design/algorithm.md §2.2). Our per-token advantages make this harmless either way and it saves tokens.
    last = max(i for i, m in enumerate(d.mask) if m)
    return dataclasses.replace(d, tokens=d.tokens[:last + 1], mask=d.mask[:last + 1],
                               logprobs=d.logprobs[:last + 1], versions=d.versions[:last + 1])


def delegation_datums(tree: Tree, decode: Callable[[list[int]], str], *, env: EnvName = DEFAULT_ENV,
                      invalid_reward: float = 0.0, success_gate: bool = False,
                      root_reward: float | None = None) -> list[Datum]:
    """Returns one delegation datum per launch event and (TextCraft only) per invalid launch attempt of one
    rollout.

    Each is the parent's turn prompt (mask 0) + completion with mask 1 only on the launch statements' tokens
    (``decode`` is the tokenizer's decode, special tokens kept), cut after its last masked token. Rewards: the
    leaf-coverage reward R_root·w_e for events, ``invalid_reward`` for attempts that created no child. Events and
    attempts with an empty mask or no completion give no datum. TextWorld emits no invalid-attempt datums
    (docs/design/recipes.md §1b, §2): the reference scans for ``launch_subagent`` calls, which a TextWorld reply never holds, so a
    refused or childless ``<delegate>`` block is not trained in the delegation stage.
    """
    idx = TreeIndex.build(tree)
    events, excluded = R.leaf_coverage_rewards(tree, root_reward, success_gate=success_gate)
    fork_steps: dict[str, dict[int, R.LaunchEvent]] = {}
    for ev in events:
        fork_steps.setdefault(ev.parent_id, {})[ev.fork_step] = ev
    invalid_datums = environment(env).invalid_launch_datums  # TextCraft's launch attempts that made no child
    parents = sorted(tree.nodes, key=lambda i: (idx.depth[i], i))
    out: list[Datum] = []
    for pid in parents:
        node, started = tree.nodes[pid], False
        for step, turn in enumerate(node.turns):
            ev = fork_steps.get(pid, {}).get(step)
            if ev is None and (not invalid_datums or pid in excluded or "launch_subagent" not in turn.code):
                continue
            if turn.completion_id is None or not turn.completion_ids:
                continue
            cmask = launch_token_mask(turn.code, turn.completion_ids, decode, env=env)
            if not any(cmask):
                continue
            reward = ev.reward if ev is not None else float(invalid_reward)
            meta = {"fork_step": step, "invalid": ev is None, "weight": ev.weight if ev else 0.0,
                    "child_ids": list(ev.child_ids) if ev else []}
            d = _datum(turn.prompt_ids, turn, cmask, reward=reward, objective="delegation",
                       traj_depth=idx.depth[pid], traj_start=int(not started), tree_id=tree.id,
                       task_id=tree.task_id, node_id=pid, rollout_index=tree.root_rollout_index or 0,
                       group_id=f"{pid}:{step}", meta=meta)
            out.append(_truncate_after_last(d))
            started = True
    return out


def policy_tokens(turn) -> bool:
    """Returns whether a recorded call's tokens are the trainable policy's: a side call played by another backend
    (``misc["backend"]``: frozen, endpoint) is not, nor a turn whose behaviour logprobs are unknown (NaN: served)."""
    if turn.misc.get("backend", "policy") != "policy":
        return False
    return not any(lp != lp for lp in turn.logprobs)


def rubric_datums(trees: Sequence[Tree], *, objective: str = "hinge", margin: float = 0.2,
                  scale: float = 2.0) -> list[Datum]:
    """Returns the rubric-generation datums of one task group: one per *ranked* fork group (the fresh rubric
    request's prompt, mask 0, + its whole completion, mask 1), reward = the group's ranking reward
    (``objective`` "hinge" or "order_discrimination"). With no ranked group at all, one empty placeholder datum
    flagged non-trainable is returned so the task group still counts (docs/design/algorithm.md §5.6)."""
    out: list[Datum] = []
    task_id = trees[0].task_id if trees else ""
    for tree in trees:
        for g in tree.fork_groups:
            if g.skipped or g.rubric is None or g.rubric_turn is None or not g.rubric_turn.completion_ids:
                continue
            if not policy_tokens(g.rubric_turn):  # only the trainable policy's tokens are trained (roles.md)
                continue
            scores = [b.score for b in g.branches]
            labels = [b.success for b in g.branches]
            if objective == "hinge":
                r = R.hinge_rank_reward(scores, labels, margin)
            elif objective == "order_discrimination":
                r = R.rank_disc_reward(scores, labels, margin, scale)
            else:
                raise ValueError(f"unknown ranking objective {objective!r}")
            if r is None:
                continue
            t = g.rubric_turn
            out.append(_datum(t.prompt_ids, t, [1] * len(t.completion_ids), reward=r,
                              objective="rubric_generation", traj_depth=g.child_depth, traj_start=1,
                              tree_id=tree.id, task_id=tree.task_id, node_id=g.parent_id,
                              rollout_index=tree.root_rollout_index or 0, group_id=g.id))
    if not out:
        out.append(Datum(tokens=(), mask=(), logprobs=(), versions=(), reward=0.0, objective="rubric_generation",
                         traj_depth=1, traj_start=1, task_id=task_id, trainable=False, advantage=0.0,
                         meta={"placeholder": True}))
    return out
