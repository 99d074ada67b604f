"""Baselines and weights that turn datum rewards into advantages (docs/design/algorithm.md §5.1–5.6), and the per-task-group
assembly ``task_group_credit`` (datums + advantages + the zero-variance verdict of §5.6).

Array functions (``loo_advantages``, ``execution_advantages``, ``root_balanced_advantages``, ``depth_weights``,
``gamma_depth_weights``) are the specification; the ``assign_*`` / ``apply_*`` helpers apply them to lists of
``Datum`` for one task group or one step batch. Baselines read ``Datum.reward`` and write ``Datum.advantage``; depth
weighting writes ``Datum.weight`` only (``rl.batch`` multiplies). No std normalisation anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.records import Tree, TreeIndex
from sera_jax.rl.datums import Datum, delegation_datums, execution_datums, rubric_datums
from sera_jax.rl.rewards import env_success
from sera_jax.rl.stages import MethodConfig

__all__ = [
    "loo_advantages", "execution_advantages", "root_balanced_advantages", "depth_weights", "gamma_depth_weights",
    "is_zero_variance", "step_is_skipped", "assign_execution_advantages", "assign_delegation_advantages",
    "assign_rubric_advantages", "apply_depth_weights", "GroupCredit", "task_group_credit", "step_rubric_credit",
    "warm_credit",
]


@partial(jax.jit, static_argnames="num_groups")
def _loo(values: Float[Array, "N"], seg: Int[Array, "N"], num_groups: int) -> Float[Array, "N"]:
    total = jax.ops.segment_sum(values, seg, num_groups)[seg]
    count = jax.ops.segment_sum(jnp.ones_like(values), seg, num_groups)[seg]
    others = (total - values) / jnp.maximum(count - 1, 1)
    return jnp.where(count > 1, values - others, 0.0)


def loo_advantages(values: Sequence[float] | Array, group_ids: Sequence[Any] | Array) -> np.ndarray:
    """Returns v_i − mean of the other values in v_i's group (0 for a group of one), in input order."""
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    n = v.shape[0]
    if n == 0:
        return v
    _, seg = np.unique(np.asarray(group_ids), return_inverse=True)
    # Pad to a power of two (padding in its own segment) so varying batch sizes reuse a few compiled shapes; the
    # padding and the slice back are numpy (an eager jnp slice would compile a program for every n).
    width = max(8, 1 << (n - 1).bit_length())
    seg_p = np.full(width, width, np.int32)
    seg_p[:n] = seg.reshape(-1)
    v_p = np.zeros(width, np.float32)
    v_p[:n] = v
    return np.asarray(_loo(v_p, seg_p, width + 1))[:n]


def warm_credit(max_datums: int = 256) -> None:
    """Runs the credit's compiled kernels once at each padded size a step can meet (LOO over up to ``max_datums``
    datums; both ranking rewards over a fork group of up to 8 branches), so that a run's warm-up leaves the rubric
    step nothing to compile."""
    from sera_jax.rl.rewards import hinge_rank_reward, rank_disc_reward

    for k in range(3, max(max_datums - 1, 7).bit_length() + 1):  # widths 8, 16, … up to ≥ max_datums
        loo_advantages([0.0] * (1 << k), [0] * (1 << k))
    hinge_rank_reward([1.0, 0.0], [True, False])
    rank_disc_reward([1.0, 0.0], [True, False])


def execution_advantages(rewards: Sequence[float], rollout: Sequence[int],
                         root_rewards: Sequence[float]) -> np.ndarray:
    """Returns A = r − (Σ_j R_j − R_i)/(N − 1) for each datum reward r of rollout i, with R the N root rewards of
    the task group (the baseline uses root rewards only); for N = 1, A = r − R_0."""
    R = np.asarray(root_rewards, dtype=np.float64)
    n = R.shape[0]
    base = (R.sum() - R) / (n - 1) if n > 1 else R.copy()
    return np.asarray(rewards, dtype=np.float64) - base[np.asarray(rollout, dtype=np.int64)]


def root_balanced_advantages(rewards: Sequence[float], rollout: Sequence[int], num_rollouts: int) -> np.ndarray:
    """Returns A = r − (Σ_j m_j − m_k)/(G − 1) for each launch datum of rollout k, m_k the mean reward of rollout
    k's launch datums (0 when it has none), over G = ``num_rollouts`` ≥ 2 root rollouts (docs/design/algorithm.md §5.4)."""
    if num_rollouts < 2:
        raise ValueError("root-balanced LOO needs at least two root rollouts")
    r = np.asarray(rewards, dtype=np.float64)
    k = np.asarray(rollout, dtype=np.int64)
    sums = np.bincount(k, weights=r, minlength=num_rollouts)
    counts = np.bincount(k, minlength=num_rollouts)
    m = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    return r - (m.sum() - m[k]) / (num_rollouts - 1)


def depth_weights(traj_counts: Mapping[int, int], datum_counts: Mapping[int, int]) -> dict[int, float]:
    """Returns w_d = Z·v_d with v_d = 1/T_d (0 when T_d = 0) and Z = Σ D_d / Σ D_d·v_d, for every depth in either
    map: each depth gets equal total trajectory mass and the mean weight per datum is 1."""
    depths = sorted(set(traj_counts) | set(datum_counts))
    v = {d: (1.0 / traj_counts[d] if traj_counts.get(d, 0) > 0 else 0.0) for d in depths}
    total = sum(datum_counts.get(d, 0) for d in depths)
    mass = sum(datum_counts.get(d, 0) * v[d] for d in depths)
    z = total / mass if mass > 0 else 0.0
    return {d: z * v[d] for d in depths}


def gamma_depth_weights(depths: Sequence[int], gamma: float) -> np.ndarray:
    """Returns γ^d per datum, normalised so the mean over the given (global) batch is 1."""
    raw = np.power(float(gamma), np.asarray(depths, dtype=np.float64))
    return raw / raw.mean() if raw.size and raw.mean() > 0 else raw


def is_zero_variance(values: Sequence[float], atol: float = 1e-12) -> bool:
    """Returns True when all values are equal (to ``atol``) — or there are none: such a task group carries no
    learning signal and is rejected (or marked non-trainable), docs/design/algorithm.md §5.6."""
    a = np.asarray(values, dtype=np.float64)
    return a.size == 0 or float(a.max() - a.min()) <= atol


def step_is_skipped(num_trainable: int, num_ranks: int = 8) -> bool:
    """Returns True when the step must be skipped (version does not advance): fewer trainable datums than ranks."""
    return num_trainable < num_ranks


# ----------------------------------------------------------------------------------------- on lists of datums

def _with_advantages(datums: Sequence[Datum], advantages: Sequence[float]) -> list[Datum]:
    return [dataclasses.replace(d, advantage=float(a)) for d, a in zip(datums, advantages)]


def _with_weights(datums: Sequence[Datum], weights: Sequence[float]) -> list[Datum]:
    return [dataclasses.replace(d, weight=float(w)) for d, w in zip(datums, weights)]


def assign_execution_advantages(datums: Sequence[Datum], root_rewards: Sequence[float]) -> list[Datum]:
    """Returns the task group's execution datums with their execution advantage set; ``root_rewards[i]`` is the
    root reward of the rollout whose ``rollout_index`` is i."""
    adv = execution_advantages([d.reward for d in datums], [d.rollout_index for d in datums], root_rewards)
    return _with_advantages(datums, adv)


def assign_delegation_advantages(datums: Sequence[Datum], num_rollouts: int) -> list[Datum]:
    """Returns the task group's launch datums with their root-balanced LOO advantage set ([] if G < 2)."""
    if num_rollouts < 2:
        return []
    adv = root_balanced_advantages([d.reward for d in datums], [d.rollout_index for d in datums], num_rollouts)
    return _with_advantages(datums, adv)


def assign_rubric_advantages(datums: Sequence[Datum]) -> list[Datum]:
    """Returns the task group's rubric datums with advantage = LOO of their rewards over its ranked groups (0 when
    K = 1); non-trainable placeholders pass through unchanged."""
    live = [d for d in datums if d.trainable]
    adv = np.asarray(loo_advantages([d.reward for d in live], [0] * len(live))) if live else []
    it = iter(_with_advantages(live, adv))
    return [next(it) if d.trainable else d for d in datums]


def depth_histogram(datums: Sequence[Datum]) -> dict[int, tuple[int, int]]:
    """Returns {depth: (trainable datums, trajectory starts)} of ``datums``: what depth weighting needs of a step's
    batch, small enough to gather from every process of a multi-host step and add up."""
    hist: dict[int, tuple[int, int]] = {}
    for d in datums:
        if d.trainable:
            c, t = hist.get(d.traj_depth, (0, 0))
            hist[d.traj_depth] = (c + 1, t + d.traj_start)
    return hist


def apply_depth_weights(datums: Sequence[Datum], gamma: float | None = None,
                        histogram: Mapping[int, tuple[int, int]] | None = None) -> list[Datum]:
    """Returns the step batch's trainable datums with their depth weight set (inverse trajectory frequency, or
    γ^depth when ``gamma`` is set; ``rl.batch`` trains on advantage × weight); non-trainable datums are removed
    first, as the trainer does.

    ``histogram`` is the whole step's ``depth_histogram`` when ``datums`` are one process's share of it (a
    multi-host step): the weights are then those of the whole batch. None: ``datums`` are the whole batch."""
    live = [d for d in datums if d.trainable]
    if histogram is not None:
        if gamma is not None:
            count = sum(c for c, _ in histogram.values())
            mean = sum(c * float(gamma) ** d for d, (c, _) in histogram.items()) / count if count else 0.0
            return _with_weights(live, [float(gamma) ** d.traj_depth / mean if mean > 0 else 1.0 for d in live])
        w = depth_weights({d: t for d, (_, t) in histogram.items()}, {d: c for d, (c, _) in histogram.items()})
        return _with_weights(live, [w[d.traj_depth] for d in live])
    if gamma is not None:
        return _with_weights(live, gamma_depth_weights([d.traj_depth for d in live], gamma))
    traj: dict[int, int] = {}
    cnt: dict[int, int] = {}
    for d in live:
        cnt[d.traj_depth] = cnt.get(d.traj_depth, 0) + 1
        traj[d.traj_depth] = traj.get(d.traj_depth, 0) + d.traj_start
    w = depth_weights(traj, cnt)
    return _with_weights(live, [w[d.traj_depth] for d in live])


# ------------------------------------------------------------------------------------------ one task group

@dataclasses.dataclass(frozen=True)
class GroupCredit:
    """The advantaged datums of one task group (before depth weighting) and whether the group is accepted."""

    datums: list[Datum]
    accepted: bool


def task_group_credit(stage: str, trees: Sequence[Tree], method: MethodConfig, *,
                      decode: Callable[[list[int]], str] | None = None, env: EnvName = DEFAULT_ENV,
                      filter_zero_variance: bool | None = None) -> GroupCredit:
    """Returns the stage's datums for the G root rollouts of one task, with advantages, and the §5.6 verdict.

    execution: rewards per ``method.execution_reward``, TextCraft error filter, root-reward LOO; a zero-variance
    group is rejected when ``filter_zero_variance`` (default: TextCraft) else kept, trainable, with zero advantages
    (TextWorld, docs/design/recipes.md §1b).
    delegation: launch datums (``decode`` required), leaf-coverage reward, ``method.launch_advantage_mode``;
    rejected with G < 2, no launch datum, or all-equal advantages.
    rubric_generation: one datum per ranked fork group, LOO over them; always accepted (with
    ``method.rubric_filter_unranked_groups``, only when one group at least was ranked).
    Rollout indices are re-numbered 0..G−1 in the order given.
    """
    trees = [dataclasses.replace(t, root_rollout_index=i) for i, t in enumerate(trees)]
    spec = environment(env)  # its credit rules (agents.environments)
    if stage == "execution":
        ds = [d for t in trees for d in execution_datums(t, mode=method.execution_reward,
                                                          filter_errors=spec.filter_errors)]
        roots = [env_success(t.nodes[TreeIndex.build(t).root]) for t in trees]
        ds = assign_execution_advantages(ds, roots)
        reject = spec.filter_zero_variance if filter_zero_variance is None else filter_zero_variance
        if reject and is_zero_variance([d.advantage for d in ds]):
            return GroupCredit([], False)
        # Kept (TextWorld, docs/design/recipes.md §1b): an all-equal group stays trainable, its zero advantages count in the
        # token-mean denominator and it fills its rank's slot.
        return GroupCredit(ds, True)
    if stage == "delegation":
        if decode is None:
            raise ValueError("delegation credit needs the tokenizer's decode")
        if method.launch_credit_mode != "leaf":
            raise NotImplementedError("workload credit needs gold plans, which the records do not carry yet")
        if len(trees) < 2:
            return GroupCredit([], False)
        ds = [d for t in trees for d in delegation_datums(
            t, decode, env=env, invalid_reward=method.invalid_delegation_reward,
            success_gate=method.subagent_success_gate)]
        if not ds:
            return GroupCredit([], False)
        mode = method.launch_advantage_mode
        if mode == "reward_first_root_balanced":
            ds = assign_delegation_advantages(ds, len(trees))
        elif mode == "reward_first_flat":
            ds = _with_advantages(ds, np.asarray(loo_advantages([d.reward for d in ds], [0] * len(ds))))
        elif mode == "credit_weighted_root":
            R = np.array([env_success(t.nodes[TreeIndex.build(t).root]) for t in trees])
            loo = R - (R.sum() - R) / (len(R) - 1)
            ds = _with_advantages(ds, [d.meta["weight"] * loo[d.rollout_index] for d in ds])
        else:
            raise ValueError(f"unknown launch advantage mode {mode!r}")
        if method.delegation_filter_zero_variance_groups and is_zero_variance([d.advantage for d in ds]):
            return GroupCredit([], False)
        return GroupCredit(ds, True)
    if stage == "rubric_generation":
        ds = rubric_datums(trees, objective=method.ranking_objective, margin=method.ranking_margin,
                           scale=method.discrimination_scale)
        if method.rubric_filter_unranked_groups and not any(d.trainable for d in ds):  # only the placeholder
            return GroupCredit([], False)
        return GroupCredit(_signed(assign_rubric_advantages(ds), method.rubric_advantage_sign), True)
    raise ValueError(f"unknown stage {stage!r}")


def _signed(datums: Sequence[Datum], sign: float) -> list[Datum]:
    """Returns ``datums`` with trainable advantages times ``sign`` (the ``rubric_advantage_sign`` control)."""
    if sign == 1.0:
        return list(datums)
    return [dataclasses.replace(d, advantage=sign * d.advantage) if d.trainable else d for d in datums]


# ------------------------------------------------------------------------------------- the step's task groups

def step_rubric_rewards(groups: Sequence[GroupCredit]) -> list[float]:
    """Returns the ranking rewards of the step's live rubric datums in order (what ``step_rubric_credit`` pools)."""
    live = [d for g in groups for d in g.datums if d.trainable and d.objective == "rubric_generation"]
    return [float(d.reward) for d in live]


def step_rubric_credit(groups: Sequence[GroupCredit], sign: float = 1.0, *, pool: Sequence[float] | None = None,
                       offset: int = 0) -> list[GroupCredit]:
    """Returns the step's rubric-generation task groups with every ranked fork group's advantage re-based on the
    leave-one-out mean of *all* the step's ranked groups (``method.rubric_baseline_scope = "step"``) instead of
    its own task's (§5.2). Each datum's ranking reward is its ``reward``; placeholders and other
    stages' datums pass through. With K = 1 in the whole step the advantage is 0, as in §5.2. ``sign`` is
    ``method.rubric_advantage_sign`` (-1: the flipped control).

    ``pool`` is the whole step's ``step_rubric_rewards`` when ``groups`` are one process's share of the step (a
    multi-host step), and ``offset`` where this share's rewards start in it."""
    live = [d for g in groups for d in g.datums if d.trainable and d.objective == "rubric_generation"]
    rewards = step_rubric_rewards(groups)
    if pool is None:
        if not live:
            return list(groups)
        pool, offset = rewards, 0
    elif list(pool[offset:offset + len(rewards)]) != rewards:
        raise ValueError("this share's rubric rewards are not at the given offset of the step's pool")
    if not live:
        return list(groups)
    adv = np.asarray(loo_advantages(list(pool), [0] * len(pool)))[offset:offset + len(live)]
    new = {id(d): dataclasses.replace(d, advantage=sign * float(a)) for d, a in zip(live, adv)}
    return [GroupCredit([new.get(id(d), d) for d in g.datums], g.accepted) for g in groups]
