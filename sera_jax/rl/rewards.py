"""The three SERA rewards (docs/design/algorithm.md §5.1–5.4): execution, rubric ranking (hinge, Rank+Disc), delegation leaf coverage.

Ranking rewards run in jitted jnp over padded groups ([G, B] scores, labels and a validity mask) because the
rubric stage scores many fork groups at once; the scalar wrappers ``hinge_rank_reward`` / ``rank_disc_reward``
call the same kernels on one group and apply the skip rules on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.records import Node, Tree, TreeIndex

__all__ = [
    "env_success", "filter_success", "execution_reward", "hinge_rank_rewards", "rank_disc_rewards",
    "hinge_rank_reward", "rank_disc_reward", "ranking_diagnostics", "LaunchEvent", "leaf_coverage_rewards",
]


# ------------------------------------------------------------------------------------------- execution (§5.1)

def env_success(node: Node) -> float:
    """Returns the node's environment reward (``node.reward.environment``): 0 after a rollout error or when the
    environment never graded it."""
    if node.rollout_error_zero_reward or node.reward.environment is None:
        return 0.0
    return float(node.reward.environment)


def filter_success(node: Node) -> float:
    """Returns the flag the TextCraft error-step filter looks at: the rubric's success flag of a scored sub-agent,
    else the env success."""
    if node.rubric_score is not None:
        return float(node.rubric_score.success)
    return env_success(node)


def execution_reward(node: Node, *, is_root: bool, mode: str = "rubric", env: EnvName | None = None
                     ) -> float | None:
    """Returns the execution reward of one trajectory before its baseline, or None when it must not train.

    Root: env success in every variant. Sub-agent, ``mode="rao"``: TextCraft — its env success (the crafted-delta
    + finish check); TextWorld — the execution judge's binary label ``node.reward.judge``
    (``agents.subagent_judge``; the world check means "the whole shared task is solved", so it cannot grade a
    sub-task), None when it has none (the judge call failed or was never made: the sub-agent is not trained). A
    node carrying that label uses it whatever ``env`` says; ``env=None`` otherwise means TextCraft. Sub-agent,
    ``mode="rubric"``: ``node.reward.rubric_score`` (None if it has none — the runtime marks such nodes
    ``skip_gradient_update``). A rollout error forces 0.
    """
    if node.skip_gradient_update:
        return None
    if is_root:
        return env_success(node)
    if mode == "rao":
        if node.reward.judge is not None:
            return 0.0 if node.rollout_error_zero_reward else float(node.reward.judge)
        if env is not None and not environment(env).programmatic:
            return None  # a TextWorld sub-agent without a judge label is never graded by the world check
        return env_success(node)
    if mode != "rubric":
        raise ValueError(f"unknown execution reward mode {mode!r}")
    if node.reward.rubric_score is None:
        return None
    return 0.0 if node.rollout_error_zero_reward else float(node.reward.rubric_score)


# --------------------------------------------------------------------------------------------- ranking (§5.2–3)

def _pairs(labels: Bool[Array, "G B"], valid: Bool[Array, "G B"]) -> tuple[Array, Array]:
    pos = labels & valid
    neg = (~labels) & valid
    pair = pos[:, :, None] & neg[:, None, :]  # [G, i∈P, j∈N]
    return pair, pair.sum(axis=(1, 2))


def _ranked(labels: Bool[Array, "G B"], valid: Bool[Array, "G B"]) -> Bool[Array, "G"]:
    # Skip rules: both classes present among the valid scores (which also implies ≥ 2 valid scores).
    return jnp.any(labels & valid, axis=1) & jnp.any((~labels) & valid, axis=1) & (valid.sum(axis=1) >= 2)


@jax.jit
def hinge_rank_rewards(scores: Float[Array, "G B"], labels: Bool[Array, "G B"], valid: Bool[Array, "G B"],
                       margin: float = 0.2) -> tuple[Float[Array, "G"], Bool[Array, "G"]]:
    """Returns (R_g, ranked_g): R_g = −mean over success×failure pairs of max(0, margin − (s_i − s_j)) for each
    padded group, and whether the group is ranked (not skipped). Skipped groups get R = 0."""
    pair, npairs = _pairs(labels, valid)
    gap = scores[:, :, None] - scores[:, None, :]
    hinge = jnp.where(pair, jnp.maximum(0.0, margin - gap), 0.0).sum(axis=(1, 2))
    ranked = _ranked(labels, valid)
    return jnp.where(ranked, -hinge / jnp.maximum(npairs, 1), 0.0), ranked


@jax.jit
def rank_disc_rewards(scores: Float[Array, "G B"], labels: Bool[Array, "G B"], valid: Bool[Array, "G B"],
                      margin: float = 0.2, scale: float = 2.0, order_weight: float = 0.5,
                      disc_weight: float = 0.5) -> tuple[Float[Array, "G"], Bool[Array, "G"]]:
    """Returns (R_g, ranked_g) for the Rank+Disc objective: order_weight·mean clip((s_i − s_j)/margin, 0, 1) over
    success×failure pairs + disc_weight·clip(scale·pstdev(valid scores), 0, 1). Skipped groups get R = 0."""
    pair, npairs = _pairs(labels, valid)
    gap = scores[:, :, None] - scores[:, None, :]
    order = jnp.where(pair, jnp.clip(gap / margin, 0.0, 1.0), 0.0).sum(axis=(1, 2)) / jnp.maximum(npairs, 1)
    n = jnp.maximum(valid.sum(axis=1), 1)
    mean = jnp.where(valid, scores, 0.0).sum(axis=1) / n
    var = jnp.where(valid, (scores - mean[:, None]) ** 2, 0.0).sum(axis=1) / n  # population variance
    disc = jnp.clip(scale * jnp.sqrt(var), 0.0, 1.0)
    ranked = _ranked(labels, valid)
    return jnp.where(ranked, order_weight * order + disc_weight * disc, 0.0), ranked


def _one_group(scores: Sequence[float | None], labels: Sequence[bool | None]) -> tuple[Array, Array, Array]:
    # A branch with no valid score or no label is excluded from the comparison (not counted as 0).
    if len(scores) != len(labels):
        raise ValueError("scores and labels differ in length")
    # Pad to a multiple of 8 (the branching factor) so every group size reuses one compiled kernel.
    width = max(8, -(-len(scores) // 8) * 8)
    valid = np.zeros(width, bool)
    s = np.zeros(width, np.float32)
    y = np.zeros(width, bool)
    for k, (x, lab) in enumerate(zip(scores, labels)):
        if x is not None and lab is not None and np.isfinite(x):
            valid[k], s[k], y[k] = True, float(x), bool(lab)
    return s[None], y[None], valid[None]  # host arrays: the jitted rewards take them as they are


def hinge_rank_reward(scores: Sequence[float | None], labels: Sequence[bool | None],
                      margin: float = 0.2) -> float | None:
    """Returns the hinge ranking reward of one fork group (≤ 0; 0 iff every success beats every failure by at
    least ``margin``), or None when the group is skipped (homogeneous labels or < 2 valid scores)."""
    if not scores:
        return None
    r, ranked = jax.device_get(hinge_rank_rewards(*_one_group(scores, labels), margin))
    return float(r[0]) if bool(ranked[0]) else None


def rank_disc_reward(scores: Sequence[float | None], labels: Sequence[bool | None], margin: float = 0.2,
                     scale: float = 2.0, order_weight: float = 0.5, disc_weight: float = 0.5) -> float | None:
    """Returns the Rank+Disc reward of one fork group, or None when the group is skipped (same rules as hinge)."""
    if abs(order_weight + disc_weight - 1.0) > 1e-9 or scale < 0:
        raise ValueError("order/disc weights must sum to 1 and scale must be ≥ 0")
    if not scores:
        return None
    r, ranked = jax.device_get(rank_disc_rewards(*_one_group(scores, labels), margin, scale, order_weight,
                                                 disc_weight))
    return float(r[0]) if bool(ranked[0]) else None


def ranking_diagnostics(scores: Sequence[float], labels: Sequence[bool], margin: float = 0.2) -> dict[str, float]:
    """Returns pairwise accuracy (gap > 0), margin satisfaction (gap ≥ margin), mean gap and mean hinge over the
    success×failure pairs of one group (empty dict when there are no pairs)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    gaps = (s[y][:, None] - s[~y][None, :]).ravel()
    if gaps.size == 0:
        return {}
    return {"pairwise_accuracy": float((gaps > 0).mean()), "margin_satisfaction": float((gaps >= margin).mean()),
            "mean_gap": float(gaps.mean()), "mean_hinge": float(np.maximum(0.0, margin - gaps).mean())}


# ------------------------------------------------------------------------------------------ delegation (§5.4)

@dataclasses.dataclass(frozen=True)
class LaunchEvent:
    """One delegation event: the children sharing (parent_id, fork_step), their coverage weight and reward."""

    parent_id: str
    fork_step: int
    child_ids: tuple[str, ...]
    weight: float
    reward: float


def leaf_coverage_rewards(tree: Tree, root_reward: float | None = None, *, success_gate: bool = False,
                          ) -> tuple[list[LaunchEvent], set[str]]:
    """Returns (events, excluded_parents) of one rollout under leaf-coverage credit.

    weight w_e = |∪ descendant leaves of e's children| / |leaves of the whole tree|, reward r_e = R_root·w_e with
    R_root the root's env success (or ``root_reward``). With ``success_gate`` only children whose env success is
    ≥ 1 contribute leaves. Events whose fork_step lies outside the parent's turns are dropped and their parent
    goes into ``excluded_parents`` (not scanned for invalid attempts). Events are sorted by (parent, fork_step).
    """
    idx = TreeIndex.build(tree)
    root = idx.root
    r_root = env_success(tree.nodes[root]) if root_reward is None else float(root_reward)
    groups: dict[tuple[str, int], list[str]] = {}
    for nid in sorted(tree.nodes):
        parent = idx.parent[nid]
        fs = tree.nodes[nid].fork_step
        if parent is not None and fs is not None:
            groups.setdefault((parent, int(fs)), []).append(nid)
    total_leaves = len(idx.leaves)  # a childless root is its own single leaf, so this is ≥ 1
    events, excluded = [], set()
    for (parent, fs), kids in sorted(groups.items()):
        if not 0 <= fs < len(tree.nodes[parent].turns):
            excluded.add(parent)
            continue
        covered: set[str] = set()
        for kid in kids:
            if success_gate and env_success(tree.nodes[kid]) < 1.0:
                continue
            covered.update(idx.descendant_leaves(kid))
        w = len(covered) / total_leaves
        events.append(LaunchEvent(parent, fs, tuple(kids), w, r_root * w))
    return events, excluded
