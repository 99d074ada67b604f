"""Record builders shared by the credit-assignment tests."""

from __future__ import annotations

import itertools

import numpy as np

from sera_jax.agents.records import Node, Tree, Turn, legacy_reward
from sera_jax.rl.datums import Datum

_ids = itertools.count()


def turn(index: int, prompt, completion, *, version: int = 3, code: str = "", output: str = "", error: str = "",
         completion_id: str | None = "auto", text: str = "", reward_misc=None, logprob_base: float = -0.1) -> Turn:
    """A turn whose logprobs are distinct per token (so misplaced logprobs are detected)."""
    completion = list(completion)
    return Turn(index=index, prompt_ids=list(prompt), completion_ids=completion,
                logprobs=[logprob_base - 0.01 * k for k in range(len(completion))], policy_version=version,
                completion_id=f"c{next(_ids)}" if completion_id == "auto" else completion_id,
                completion_text=text, code=code, output=output, error=error, reward_misc=dict(reward_misc or {}))


def node(nid: str, *, parent: str | None = None, fork_step: int | None = None, depth: int = 0, turns=(),
         success: float | None = None, **kw) -> Node:
    """A node described as older records held its reward (turn ``reward/…`` records, ``env_labels``, a
    ``RubricScore``), its ``Reward`` read from them by ``legacy_reward`` unless one is given."""
    turns = list(turns)
    if success is not None and turns:
        turns[-1].reward_misc.setdefault("reward/success", success)
    n = Node(id=nid, goal=f"goal of {nid}", parent_id=parent, fork_step=fork_step, depth=depth, turns=turns, **kw)
    if "reward" not in kw:
        n.reward = legacy_reward(n)
    return n


def tree(tid: str, nodes, *, index: int = 0, task_id: str = "task0", **kw) -> Tree:
    nodes = list(nodes)
    root = next(n.id for n in nodes if n.parent_id is None)
    return Tree(id=tid, task_id=task_id, root_id=root, nodes={n.id: n for n in nodes}, root_rollout_index=index,
                **kw)


def random_datums(rng: np.random.Generator, n: int, max_len: int = 60) -> list[Datum]:
    out = []
    for i in range(n):
        L = int(rng.integers(2, max_len))
        p = int(rng.integers(1, L))  # at least one prompt token, at least one completion token
        mask = [0] * p + [int(x) for x in rng.integers(0, 2, L - p)]
        mask[-1] = 1
        out.append(Datum(tokens=tuple(int(t) for t in rng.integers(1, 50, L)), mask=tuple(mask),
                         logprobs=tuple(float(-x) if m else 0.0 for x, m in zip(rng.random(L), mask)),
                         versions=tuple(3 if m else -1 for m in mask), reward=(r := float(rng.normal())),
                         advantage=r, objective="execution", traj_depth=0, traj_start=1, node_id=f"n{i}"))
    return out
