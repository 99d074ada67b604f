"""One multi-host step's shared figures: what each process tells the others after its rollouts, and what every
process then computes identically from them.

Each process runs its own admission ranks' task groups (``parallel.hosts.deal_ranks``) and packs its own datums.
Nothing else of a rollout crosses hosts. One all-gather of small host figures (``parallel.hosts.Exchange``) after
the rollouts carries:

* the decisions' inputs: groups accepted, trainable datums, a stop request (Ctrl-C / SIGTERM on any process);
* the batch shape's inputs: the longest trainable sequence (→ the row length T every process packs to) and the
  loss-token count (the CISPO token mean's denominator is the whole step's);
* the step-wide credit pools: the depth histogram (depth weighting normalises over the whole batch) and the
  rubric ranking rewards (``rubric_baseline_scope: step`` re-bases on every ranked group of the step);
* the figures process 0 records: admission counts, tree scalars (the trees without their turns), advantages,
  staleness, generation counters and wall times, and each process's own generation figures
  (``process/<i>/…``).

A second, smaller gather agrees on the micro-batch count M (the largest any process packed). Every process computes
the same skip / stop / shape from the same gathered list, so the global programs (step, publish, save) stay in
lockstep; none is behind ``process_index() == 0``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np

from sera_jax.agents.infra import INFRA_KEY
from sera_jax.agents.records import Tree, tree_from_dict, tree_to_dict
from sera_jax.rl.baselines import GroupCredit, depth_histogram, step_rubric_rewards
from sera_jax.rl.batch import count_loss_tokens

SUMMED_STATS = ("groups_started", "groups_rejected", "groups_speculative", "groups_cancelled", "groups_carried",
                "groups_stale_dropped", "trees", "unrecorded_trees")


def light_tree(tree: Tree) -> dict[str, Any]:
    """Returns a tree's record without its turns (token ids and logprobs): what step metrics read, small enough to
    gather every step. Always JSON-able: a value JSON cannot hold (the case ``Loop._write_trees`` counts as a tree it
    could not record) is gathered as its ``repr``, and a record that still fails keeps only its infrastructure
    reason in its ``misc`` fields, so one tree never stops the exchange."""
    try:
        d = _without_turns(tree_to_dict(tree), tree)
        json.dumps(d)
        return d
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return json.loads(json.dumps(_without_turns(tree_to_dict(tree), tree), default=repr))
    except (TypeError, ValueError, RecursionError):
        bare = dataclasses.replace(
            tree, misc={k: v for k, v in tree.misc.items() if k == INFRA_KEY},
            nodes={k: dataclasses.replace(n, turns=[], misc={}) for k, n in tree.nodes.items()})
        return json.loads(json.dumps(tree_to_dict(bare), default=repr))


def _without_turns(d: dict[str, Any], tree: Tree) -> dict[str, Any]:
    # The actor's per-role spend is counted from the turns: kept as a summary (training.stats.role_spend reads it).
    from sera_jax.training.stats import ACTOR_SPEND_KEY, actor_spend

    d["misc"][ACTOR_SPEND_KEY] = actor_spend(tree)
    for node in d["nodes"].values():
        node["turns"] = []
    return d


def local_figures(*, stage: str, version: int, groups: Sequence[GroupCredit], stats: dict[str, Any], trees: Sequence[Tree],
                  rubric_step_scope: bool, times: dict[str, float], generation: dict[str, float],
                  efficiency: dict[str, float], stop: int) -> dict[str, Any]:
    """Returns this process's figures for the step's exchange (JSON-able); ``stop`` is the signal number of a stop
    this process was asked for (0: none)."""
    datums = [d for g in groups for d in g.datums]
    trainable = [d for d in datums if d.trainable]
    rebased = {id(d) for d in trainable if d.objective == "rubric_generation"} if rubric_step_scope else set()
    lags = staleness_lags(groups, version)
    return {
        "stop": int(stop), "groups": len(groups), "datums": len(datums), "trainable": len(trainable),
        "loss_tokens": count_loss_tokens(trainable),
        "max_len": max((len(d.tokens) - 1 for d in trainable), default=0),
        "depth": {str(k): list(v) for k, v in depth_histogram(trainable).items()},
        "rubric_rewards": step_rubric_rewards(groups) if rubric_step_scope and stage == "rubric_generation" else [],
        # (advantage, whether step-scope rubric credit re-bases it) per datum: the advantage figures after re-basing
        "advantages": [[float(d.advantage), id(d) in rebased] for d in datums],
        "lags": [max(lags), sum(lags), len(lags)] if lags else None,
        "stats": {k: stats.get(k, 0) for k in SUMMED_STATS} | {"group_lag_max": stats.get("group_lag_max", 0)},
        "trees": [light_tree(t) for t in trees],
        "times": times, "generation": generation, "efficiency": efficiency,
    }


@dataclasses.dataclass(frozen=True)
class SharedStep:
    """What every process derives from the gathered figures (identical everywhere)."""

    figures: list[dict[str, Any]]

    @property
    def stop(self) -> int:
        """The signal number of a stop asked for on any process (the lowest process's), 0 for none."""
        return next((int(f["stop"]) for f in self.figures if f["stop"]), 0)

    @property
    def stopped_by(self) -> list[int]:
        return [p for p, f in enumerate(self.figures) if f["stop"]]

    @property
    def groups(self) -> int:
        return sum(f["groups"] for f in self.figures)

    @property
    def trainable(self) -> int:
        return sum(f["trainable"] for f in self.figures)

    @property
    def loss_tokens(self) -> int:
        return sum(f["loss_tokens"] for f in self.figures)

    @property
    def max_len(self) -> int:
        return max(f["max_len"] for f in self.figures)

    def depth_histogram(self) -> dict[int, tuple[int, int]]:
        """Returns the whole step's {depth: (trainable datums, trajectory starts)}."""
        out: dict[int, tuple[int, int]] = {}
        for f in self.figures:
            for k, (c, t) in f["depth"].items():
                c0, t0 = out.get(int(k), (0, 0))
                out[int(k)] = (c0 + c, t0 + t)
        return out

    def rubric_pool(self, process: int) -> tuple[list[float], int]:
        """Returns (the step's rubric rewards in rank order, where ``process``'s share starts in it)."""
        pool: list[float] = []
        offset = 0
        for p, f in enumerate(self.figures):
            if p == process:
                offset = len(pool)
            pool.extend(f["rubric_rewards"])
        return pool, offset

    def metrics(self, *, env, sign: float, rubric_step_scope: bool) -> dict[str, Any]:
        """Returns the step's reduced figures for the record: sums of counts, the trees' scalars over every
        process's trees, advantages after step-scope re-basing, generation sums, the slowest process's wall times,
        and each process's own generation figures under ``process/<i>/``."""
        from sera_jax.training.loop import generation_metrics
        from sera_jax.training.stats import tree_metrics

        out: dict[str, Any] = {"groups_accepted": self.groups, "processes": len(self.figures)}
        for k in SUMMED_STATS:
            out[k] = sum(f["stats"][k] for f in self.figures)
        out["group_lag_max"] = max(f["stats"]["group_lag_max"] for f in self.figures)
        trees = [tree_from_dict(t) for f in self.figures for t in f["trees"]]
        out.update(tree_metrics(trees, env=env))
        advantages = [a for f in self.figures for a in f["advantages"]]
        if advantages:
            values = np.asarray([a for a, _ in advantages], np.float64)
            rebase = [i for i, (_, r) in enumerate(advantages) if r]
            if rubric_step_scope and rebase:
                from sera_jax.rl.baselines import loo_advantages

                pool, _ = self.rubric_pool(0)
                values[rebase] = sign * np.asarray(loo_advantages(pool, [0] * len(pool)), np.float64)
            out.update(advantage_mean=float(values.mean()), advantage_std=float(values.std()),
                       advantage_abs_max=float(np.abs(values).max()))
        lags = [f["lags"] for f in self.figures if f["lags"]]
        if lags:
            out.update(staleness_max=float(max(x[0] for x in lags)),
                       staleness_mean=float(sum(x[1] for x in lags) / sum(x[2] for x in lags)))
        times = [f["times"] for f in self.figures]
        for k in times[0]:
            out[k] = max(t.get(k, 0.0) for t in times)  # the step waits for its slowest process
        gen = [f["generation"] for f in self.figures]
        if any(gen):
            summed = {k: sum(g.get(k, 0) for g in gen) for g in gen for k in g}
            out.update(generation_metrics([{k: 0 for k in summed}], [summed], out.get("time/rollout_s", 0.0)))
        effs = [f["efficiency"] for f in self.figures]
        busy = [e["engine_busy_fraction"] for e in effs if "engine_busy_fraction" in e]
        if busy:
            out["rollout/engine_busy_fraction"] = float(np.mean(busy))
        for k in sorted({k for e in effs for k in e if k.startswith("agent_")}):
            out[f"agents/{k[6:]}"] = float(sum(e.get(k, 0.0) for e in effs))
        for p, f in enumerate(self.figures):
            out[f"process/{p}/completion_tokens"] = float(f["generation"].get("generated_tokens", 0))
            out[f"process/{p}/trees"] = float(f["stats"]["trees"])
            out[f"process/{p}/time/rollout_s"] = float(f["times"].get("time/rollout_s", 0.0))
            if "engine_busy_fraction" in f["efficiency"]:
                out[f"process/{p}/engine_busy_fraction"] = float(f["efficiency"]["engine_busy_fraction"])
        return out


def staleness_lags(groups: Sequence[GroupCredit], version: int) -> list[int]:
    """Returns the version lag of every trained token (``loop.token_staleness``'s input), for gathering."""
    return [version - v for g in groups for d in g.datums if d.trainable
            for v, m in zip(d.versions, d.mask) if m and v >= 0]
